package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/recovery"
	"github.com/meshnode/meshnode/snapshot"
	"github.com/spf13/cobra"
)

// genesisFromSnapshot is genesis --from-snapshot: the snapshot and the recovery key are
// checked whole first, and only then is the data dir written.
func genesisFromSnapshot(cmd *cobra.Command, expect int, file, keyFile string, asJSON bool) error {
	switch {
	case file == "":
		return usagef("--recovery-key-file is for --from-snapshot FILE: name the snapshot to restore")
	case keyFile == "":
		return usagef("--from-snapshot needs --recovery-key-file F, the file holding the mesh's recovery key (`meshnode vault recovery-key` prints it): " +
			"without it the vault's secrets, the modules' seeds the vault keeps and the route credential (the mesh's CA) cannot be restored (docs/operations.md, Backups)")
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return err
	}
	from, operator, err := openSnapshot(abs, keyFile)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(cmd, config.Run())
	if err != nil {
		return err
	}
	f, err := datadir.PrepareRestore(cfg, expect, from, operator)
	if err != nil {
		return err
	}
	out := map[string]any{"mesh_id": f.MeshID, "expect": expect, "restored_from": abs}
	if operator != "" {
		out["operator_key"] = operator
	}
	// A single node restores at once: its first start is here.
	kept, err := firstServer(cmd, cfg, f, expect, out, "is being restored", "its first start failed", "goes on with the restore")
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "mesh %s restored from %s (saved %s); node %s is its first server\n", f.MeshID, abs, from.From.Created.Format("2006-01-02T15:04:05Z"), cfg.Name)
	if kept != "" {
		fmt.Fprintf(w, "its addresses are kept in %s\n", kept)
	}
	if operator != "" {
		fmt.Fprintf(w, "operator: %s — the mesh's operator.nk from before goes on working (pass --creds FILE); none was minted\n", operator)
	}
	if expect >= 3 {
		fmt.Fprintf(w, "founding token (for the other %d founding nodes; they wait for this node to restore the mesh's streams — keep it secret):\n  %s\n", expect-1, out["founding_token"])
		fmt.Fprintf(w, "start it:  meshnode run --data-dir %s --name %s  (it restores the snapshot's streams once the founding nodes have met)\n", cfg.DataDir, cfg.Name)
		return nil
	}
	fmt.Fprintf(w, "start it:  meshnode run --data-dir %s --name %s\n", cfg.DataDir, cfg.Name)
	return nil
}

// openSnapshot checks the snapshot at path whole and opens its sealed foundation with the
// recovery key in keyFile: what genesis takes from them, and the operator's public key.
func openSnapshot(path, keyFile string) (genesis.Restored, string, error) {
	b, err := readBounded(keyFile, "recovery key", maxSeedBytes)
	if err != nil {
		return genesis.Restored{}, "", fmt.Errorf("read the recovery key: %w; pass the file `meshnode vault recovery-key` wrote", err)
	}
	barrier, err := recovery.ParseKey(string(b))
	if err != nil {
		return genesis.Restored{}, "", fmt.Errorf("%s: %w", keyFile, err)
	}
	r, err := snapshot.Open(path)
	if err != nil {
		return genesis.Restored{}, "", err
	}
	defer r.Close()
	man := r.Manifest()
	if man.Foundation == nil {
		return genesis.Restored{}, "", fmt.Errorf("%s carries no sealed foundation (it was saved by a meshnode that did not ask the vault for one, or by an operator the vault did not answer): "+
			"a restore from it would lose the vault's secrets and a new CA; save a snapshot with this meshnode and restore that", path)
	}
	if man.Foundation.MeshID != man.MeshID {
		return genesis.Restored{}, "", fmt.Errorf("%s: its sealed foundation is mesh %s's, its streams mesh %s's; save the snapshot again", path, man.Foundation.MeshID, man.MeshID)
	}
	f, err := recovery.Open(barrier, man.Foundation)
	if err != nil {
		return genesis.Restored{}, "", fmt.Errorf("%s: %w", path, err)
	}
	return genesis.Restored{
		MeshID: man.MeshID, RouteSecret: f.RouteSecret, GossipKey: f.GossipKey, BarrierKey: barrier, VaultSeed: f.VaultSeed,
		From: genesis.Restoring{File: path, SHA256: r.ManifestSum(), Created: man.Created},
	}, man.Operator, nil
}
