package datadir_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
)

// TestOpen_RefusesWhatItCannotUse: a store held by another opener is in use, an empty or
// foreign file is damaged; each refusal says so by its error value.
func TestOpen_RefusesWhatItCannotUse(t *testing.T) {
	dir := t.TempDir()
	db, err := datadir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := datadir.Open(dir); !errors.Is(err, datadir.ErrDataDirInUse) {
		t.Fatalf("a second open of a held store: %v, want ErrDataDirInUse", err)
	}
	db.Close()

	for name, content := range map[string][]byte{"empty": {}, "not bbolt": []byte("this is not a bbolt file, but long enough to be read as one's header page")} {
		bad := t.TempDir()
		if err := os.WriteFile(filepath.Join(bad, datadir.StoreFile), content, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := datadir.Open(bad); !errors.Is(err, datadir.ErrCorruptStore) {
			t.Errorf("%s store file: %v, want ErrCorruptStore", name, err)
		}
	}
}

// TestLoadIdentity_CreatesOnceAndKeepsItsName: a data dir holds no node until genesis makes
// one; from then on it is that node's, under that name only, and the same across opens.
func TestLoadIdentity_CreatesOnceAndKeepsItsName(t *testing.T) {
	dir := t.TempDir()
	db, err := datadir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, _, err := datadir.LoadIdentity(db, dir, "alpha", true, false, 1); !errors.Is(err, datadir.ErrNoIdentity) {
		t.Fatalf("an empty data dir without create: %v, want ErrNoIdentity", err)
	}
	id, f, err := datadir.LoadIdentity(db, dir, "alpha", true, true, 1)
	if err != nil {
		t.Fatal(err)
	}
	if id.Name != "alpha" || id.MeshID == "" || id.PublicKey == "" || f == nil {
		t.Fatalf("created %+v", id)
	}
	again, _, err := datadir.LoadIdentity(db, dir, "alpha", true, false, 1)
	if err != nil || again != id {
		t.Fatalf("loaded again: %+v, %v; want %+v", again, err, id)
	}
	if _, _, err := datadir.LoadIdentity(db, dir, "beta", true, false, 1); !errors.Is(err, datadir.ErrNameMismatch) {
		t.Fatalf("another name given: %v, want ErrNameMismatch", err)
	}
	if same, _, err := datadir.LoadIdentity(db, dir, "host-default", false, false, 1); err != nil || same.Name != "alpha" {
		t.Fatalf("no name given: %+v, %v; want the data dir's node alpha", same, err)
	}
}

// TestPrepare_RefusesAMeshsData: genesis without a bus refuses a data dir that holds a
// mesh's data outside the store, and the info file round-trips.
func TestPrepare_RefusesAMeshsData(t *testing.T) {
	cfg := config.Up()
	cfg.DataDir, cfg.Name = t.TempDir(), "alpha"
	if err := os.WriteFile(filepath.Join(cfg.DataDir, datadir.OperatorSeedFile), []byte("SU...\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := datadir.Prepare(cfg, 3); !errors.Is(err, datadir.ErrMeshData) {
		t.Fatalf("prepare over an operator seed: %v, want ErrMeshData", err)
	}

	if _, err := datadir.ReadInfo(cfg.DataDir); !errors.Is(err, datadir.ErrNotRunning) {
		t.Fatalf("no node.json: %v, want ErrNotRunning", err)
	}
	info := datadir.Info{Name: "alpha", PID: os.Getpid(), ClientURL: "nats://127.0.0.1:4222"}
	if err := datadir.WriteInfo(cfg.DataDir, info); err != nil {
		t.Fatal(err)
	}
	if got, err := datadir.ReadInfo(cfg.DataDir); err != nil || got != info {
		t.Fatalf("read back %+v, %v; want %+v", got, err, info)
	}
	datadir.RemoveInfo(cfg.DataDir)
	if _, err := datadir.ReadInfo(cfg.DataDir); !errors.Is(err, datadir.ErrNotRunning) {
		t.Fatalf("after RemoveInfo: %v, want ErrNotRunning", err)
	}
}
