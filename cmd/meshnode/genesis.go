package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/node"
	"github.com/spf13/cobra"
)

// maxExpect bounds the servers a mesh is founded with or grows to (--expect). Every one of
// them is a voter of JetStream's meta group, whose every change waits for a majority; more
// than a few dozen is no mesh anyone runs but a typo (999999999999 founded a mesh that could
// never reach quorum, exit 0).
const maxExpect = 64

func newGenesisCmd() *cobra.Command {
	var expect int
	var asJSON bool
	var fromSnapshot, keyFile string
	cmd := &cobra.Command{
		Use:   "genesis --data-dir DIR --name NAME [--expect 1|3|…] [--from-snapshot FILE --recovery-key-file F]",
		Short: "Create a new mesh with this node as its first",
		Example: `  meshnode genesis --data-dir /var/lib/meshnode --name a
  meshnode genesis --data-dir /var/lib/meshnode --name a --expect 3 --json
  meshnode genesis --data-dir /var/lib/meshnode --name a --from-snapshot mesh.snap --recovery-key-file rk.txt`,
		Long: `Create a new mesh: mint its foundation (mesh id, this node's keys, the route credential,
the gossip key, the vault's barrier key and bus identity), raise store, bus and vault, and
hand off to the vault, which mints the operator's credential. Then start the node with
meshnode run. With --expect 3 or more, genesis prints the founding token the other founding
nodes need; a mesh of 2 is refused (losing either server would stop JetStream).

With --from-snapshot FILE and --recovery-key-file F (what meshnode vault recovery-key
printed), genesis restores a mesh whose servers were all lost: the mesh keeps its id, route
credential (so its ca.pem), gossip key, barrier key and vault identity — the snapshot's,
opened with the recovery key — while this node's keys are new. No operator credential is
minted: the operator's operator.nk from before goes on working. The file and the key are
checked whole before anything is written; a data dir with mesh data is refused. The node's
first start restores every stream of the file before it opens anything else; with --expect 3
the other founding nodes join with the founding token and wait for it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if expect == 2 {
				return usageError{err: genesis.ErrTwoServers}
			}
			if expect < 1 || expect > maxExpect {
				return usagef("--expect %d: a mesh has 1 server, or 3 to %d", expect, maxExpect)
			}
			if fromSnapshot != "" || keyFile != "" {
				return genesisFromSnapshot(cmd, expect, fromSnapshot, keyFile, asJSON)
			}
			cfg, err := loadConfig(cmd, config.Run())
			if err != nil {
				return err
			}
			out := map[string]any{"operator_creds": filepath.Join(cfg.DataDir, datadir.OperatorSeedFile), "expect": expect}
			// Genesis refuses a data dir that already belongs to a mesh.
			f, r, err := datadir.Prepare(cfg, expect)
			if err != nil {
				return err
			}
			out["mesh_id"] = r.MeshID
			// A single node is raised once, for the vault to mint the operator's credential:
			// the hand-off.
			kept, err := firstServer(cmd, cfg, f, expect, out, "was created", "raising the node for the hand-off failed", "completes the hand-off")
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "mesh %s created; node %s is its first server\n", out["mesh_id"], cfg.Name)
			if kept != "" {
				fmt.Fprintf(w, "its addresses are kept in %s: `meshnode run --data-dir %s` and the service start it with them\n", kept, cfg.DataDir)
			}
			if expect >= 3 {
				fmt.Fprintf(w, "founding token (for the other %d founding nodes; it carries the mesh's route credential and gossip key — keep it secret):\n  %s\n", expect-1, out["founding_token"])
				fmt.Fprintf(w, "the operator credential will be %s once the founding nodes have met\n", out["operator_creds"])
				return nil
			}
			fmt.Fprintf(w, "operator credential: %s (0600; the CLI uses it by default)\n", out["operator_creds"])
			fmt.Fprintf(w, "start it:  meshnode run --data-dir %s --name %s\n", cfg.DataDir, cfg.Name)
			return nil
		},
	}
	addNodeFlags(cmd, config.Run())
	cmd.Flags().IntVar(&expect, "expect", 1, "servers the mesh starts with: 1, or 3 to 64")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object, founding_token with --expect 3 or more: mesh_id, operator_creds, expect, founding_token?, config?, restored_from?, operator_key?")
	cmd.Flags().StringVar(&fromSnapshot, "from-snapshot", "", "restore the mesh the snapshot `FILE` holds (meshnode snapshot save), into this fresh data dir")
	cmd.Flags().StringVar(&keyFile, "recovery-key-file", "", "with --from-snapshot: the `FILE` holding the mesh's recovery key (meshnode vault recovery-key)")
	return cmd
}

// firstServer does what founding a mesh (genesis, or genesis --from-snapshot) ends with on
// its first server: keeps the addresses given on the command line in the data dir's config,
// then either mints the founding token the other founders join with (expect ≥ 3, into
// out["founding_token"]) or raises the single node once and stops it (its first start:
// the hand-off, or the restore). It returns where the addresses were kept ("" if nowhere).
// did, failed and then word the errors: "mesh M <did>, but <failed>: …; … <then>".
func firstServer(cmd *cobra.Command, cfg config.Config, f *genesis.Foundation, expect int, out map[string]any, did, failed, then string) (string, error) {
	kept, err := keepAddresses(cmd, cfg)
	if err != nil {
		return "", fmt.Errorf("mesh %s %s, but %w; write them to %s yourself", f.MeshID, did, err, filepath.Join(cfg.DataDir, config.FileName))
	}
	if kept != "" {
		out["config"] = kept
	}
	if expect >= 3 {
		out["founding_token"] = f.FoundingToken(expect, []string{cfg.GossipAddr})
		return kept, nil
	}
	n := node.New(cfg, newLogger(cfg, os.Stderr))
	if err := n.Open(); err != nil {
		return "", fmt.Errorf("mesh %s %s, but %s: %w; fix that, then `meshnode run --data-dir %s --name %s` %s", f.MeshID, did, failed, err, cfg.DataDir, cfg.Name, then)
	}
	n.Close()
	return kept, nil
}
