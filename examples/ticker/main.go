// Command ticker is an example module as a user writes one, run by a host (`meshnode
// deploy`): it connects with what the host gives it (MESH_URL, MESH_CREDS, MESH_NODE) and
// emits a signed `tick` event every interval until it is stopped.
//
//	module: ticker
//	requires: [mesh-bus]
//	emits: [tick]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/sdk"
)

func main() {
	every := flag.Duration("every", 200*time.Millisecond, "how often to tick")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *every); err != nil {
		fmt.Fprintln(os.Stderr, "ticker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, every time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := sdk.Connect(cctx, os.Getenv("MESH_URL"), os.Getenv("MESH_CREDS"))
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	node := os.Getenv("MESH_NODE")
	fmt.Printf("ticking on %s as %s\n", node, c.Instance())
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			fmt.Println("stopped")
			return nil
		case <-tick.C:
		}
		if _, err := c.Emit(ctx, "tick", map[string]any{"node": node, "n": n}); err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "emit:", err)
		}
	}
}
