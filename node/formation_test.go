package node_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nkeys"
)

// TestFormation_RefusesMeshData: found and join refuse a data dir that holds a mesh's data
// (an operator seed, a JetStream store) as genesis does, before they mint or spend anything,
// and accept a fresh one. Before, only a foundation in the store was refused, and a node
// would start over another mesh's JetStream store.
func TestFormation_RefusesMeshData(t *testing.T) {
	t.Parallel()
	founder := clusterConfig(t, "a")
	f, _, err := datadir.Prepare(founder, 3)
	if err != nil {
		t.Fatal(err)
	}
	founding := f.FoundingToken(3, []string{founder.GossipAddr})
	tokenKey, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := tokenKey.Seed()
	// A join token of the right shape: the refusal comes before it is traded (no node
	// answers at its address).
	join := vault.Bearer{MeshID: f.MeshID, ID: "t1", Seed: string(seed), Addrs: []string{"nats://127.0.0.1:1"}, Expect: 3}.String()

	for _, tc := range []struct {
		name  string
		plant func(dir string) error
		names string // what the refusal must name
	}{
		{"OperatorSeed", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, datadir.OperatorSeedFile), []byte("SOME SEED\n"), 0o600)
		}, datadir.OperatorSeedFile},
		{"JetStreamStore", func(dir string) error { return os.MkdirAll(filepath.Join(dir, "jetstream", "$SYS"), 0o700) }, "jetstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := clusterConfig(t, "b")
			if err := tc.plant(cfg.DataDir); err != nil {
				t.Fatal(err)
			}
			if _, err := node.Found(cfg, founding); !errors.Is(err, datadir.ErrMeshData) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("Found over %s: %v, want datadir.ErrMeshData naming %s", tc.name, err, tc.names)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := node.Join(ctx, cfg, join); !errors.Is(err, datadir.ErrMeshData) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("Join over %s: %v, want datadir.ErrMeshData naming %s", tc.name, err, tc.names)
			}
		})
	}

	fresh := clusterConfig(t, "c")
	if _, err := node.Found(fresh, founding); err != nil {
		t.Fatalf("Found on a fresh data dir: %v", err)
	}
	if _, err := node.Found(fresh, founding); !errors.Is(err, genesis.ErrExists) {
		t.Fatalf("Found twice: %v, want ErrExists", err)
	}
}
