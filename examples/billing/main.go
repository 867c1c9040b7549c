// Command billing is the module of the README's tour (billing.yaml beside it): it counts the
// shop's order.placed events and answers its status tool with the count. It connects to
// MESH_URL (default nats://127.0.0.1:4222, what `meshnode up` listens on) with the seed
// -creds names (default MESH_CREDS: what a host gives a deployed module), prints one line
// once it serves, and runs until SIGINT or SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/sdk"
)

func main() {
	creds := flag.String("creds", os.Getenv("MESH_CREDS"), "the module's seed file, as `meshnode module register --creds-out` wrote it")
	flag.Parse()
	url := os.Getenv("MESH_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	if *creds == "" {
		fmt.Fprintln(os.Stderr, "billing: no seed: pass -creds billing.nk (meshnode module register wrote it)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, url, *creds); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, creds string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := sdk.Connect(cctx, url, creds, sdk.AsModule("billing"))
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	var orders atomic.Int64
	if err := c.On("shop.order.placed", func(context.Context, sdk.Event) error {
		orders.Add(1)
		return nil
	}); err != nil {
		return err
	}
	if err := c.Serve("status", func(context.Context, sdk.Request) ([]byte, error) {
		return json.Marshal(map[string]int64{"orders": orders.Load()})
	}); err != nil {
		return err
	}
	fmt.Printf("billing: serving status on %s; Ctrl-C stops it\n", url)
	<-ctx.Done()
	return nil
}
