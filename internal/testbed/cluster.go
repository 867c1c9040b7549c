package testbed

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// JetStreamCluster starts n clustered nats-servers with JetStream on loopback, routed to each
// other, and returns them once the JetStream meta group has a leader and n peers; each is
// shut down when tb ends (or earlier by the test: Shutdown twice is harmless).
func JetStreamCluster(tb testing.TB, n int) []*server.Server {
	tb.Helper()
	ports := make([]int, n)
	for i := range ports {
		_, p, err := net.SplitHostPort(FreeAddr(tb))
		if err != nil {
			tb.Fatal(err)
		}
		ports[i], _ = strconv.Atoi(p)
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	servers := make([]*server.Server, n)
	for i := range servers {
		servers[i] = NATSServer(tb, &server.Options{
			ServerName: fmt.Sprintf("s%d", i+1), JetStream: true, StoreDir: tb.TempDir(),
			Cluster: server.ClusterOpts{Name: "test", Host: "127.0.0.1", Port: ports[i]},
			Routes:  routes,
		})
	}
	RetryUntil(tb, 30*time.Second, func() error {
		for _, s := range servers {
			jsz, err := s.Jsz(&server.JSzOptions{})
			if err != nil || jsz.Meta == nil || jsz.Meta.Leader == "" || len(jsz.Meta.Replicas)+1 < n {
				return fmt.Errorf("server %s: no JetStream meta group of %d with a leader yet", s.Name(), n)
			}
		}
		return nil
	})
	return servers
}
