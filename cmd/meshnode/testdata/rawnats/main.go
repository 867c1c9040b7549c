// Command rawnats is the baseline for meshnode's start-up benchmark: nats-server embedded
// with JetStream and nothing else, ready when its /healthz answers 200.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	storeDir := flag.String("store-dir", "", "JetStream store directory")
	httpPort := flag.Int("http-port", 0, "monitoring port")
	flag.Parse()
	opts := &server.Options{
		ServerName: "raw", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		HTTPHost: "127.0.0.1", HTTPPort: *httpPort,
		JetStream: true, StoreDir: *storeDir, NoSigs: true, NoLog: true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s.Start()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
}
