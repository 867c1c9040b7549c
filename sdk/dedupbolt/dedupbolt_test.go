package dedupbolt_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/sdk/dedupbolt"
	bolt "go.etcd.io/bbolt"
)

// TestDurableDedup: ids survive closing the file; a failed handler is not marked; the
// window keeps the newest size ids of each handler; Atomically commits the handler's writes
// with the mark, or neither.
func TestDurableDedup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dedup.db")
	d, err := dedupbolt.Open(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	fail := true
	h := d.Once("h", func(_ context.Context, e sdk.Event) error {
		runs[e.ID]++
		if fail {
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	if err := h(ctx, sdk.Event{ID: "1"}); err == nil {
		t.Fatal("failure swallowed")
	}
	fail = false
	for _, id := range []string{"1", "1", "2"} {
		if err := h(ctx, sdk.Event{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	d.Close()
	d, err = dedupbolt.Open(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h = d.Once("h", func(_ context.Context, e sdk.Event) error { runs[e.ID]++; return nil })
	for _, id := range []string{"1", "2", "3", "4"} { // 4 evicts 1
		h(ctx, sdk.Event{ID: id})
	}
	if runs["1"] != 2 || runs["2"] != 1 || runs["3"] != 1 || runs["4"] != 1 {
		t.Fatalf("runs %v: want 1 twice (a failure, then once), the rest once", runs)
	}
	for id, want := range map[string]bool{"1": false, "2": true, "3": true, "4": true} {
		if seen, err := d.Seen("h", id); err != nil || seen != want {
			t.Errorf("Seen(h, %s) = %v %v, want %v", id, seen, err, want)
		}
	}
	if seen, _ := d.Seen("other", "2"); seen {
		t.Error("another handler's ids are its own")
	}

	// Atomically: the handler's write and the mark commit together, or not at all.
	work := []byte("work")
	a := d.Atomically("a", func(_ context.Context, e sdk.Event, tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(work)
		if err != nil {
			return err
		}
		if err := b.Put([]byte(e.ID), []byte("done")); err != nil {
			return err
		}
		if string(e.Data) == "fail" {
			return errors.New("after writing")
		}
		return nil
	})
	if err := a(ctx, sdk.Event{ID: "x", Data: []byte("fail")}); err == nil {
		t.Fatal("failure swallowed")
	}
	if seen, _ := d.Seen("a", "x"); seen {
		t.Fatal("a failed handler's event was marked")
	}
	if err := a(ctx, sdk.Event{ID: "y"}); err != nil {
		t.Fatal(err)
	}
	if seen, _ := d.Seen("a", "y"); !seen {
		t.Fatal("a handled event was not marked")
	}
	probe := d.Atomically("probe", func(_ context.Context, _ sdk.Event, tx *bolt.Tx) error {
		b := tx.Bucket(work)
		if b == nil || b.Get([]byte("x")) != nil || string(b.Get([]byte("y"))) != "done" {
			t.Error("the failed handler's write was kept, or the good one's lost")
		}
		return nil
	})
	probe(ctx, sdk.Event{ID: "probe"})
}
