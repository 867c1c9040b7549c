package sdk_test

import (
	"context"
	"errors"
	"testing"

	"github.com/meshnode/meshnode/sdk"
)

func TestDedup_Once(t *testing.T) {
	d := sdk.NewDedup(2)
	runs := 0
	fail := true
	h := d.Once(func(context.Context, sdk.Event) error {
		runs++
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
	h(ctx, sdk.Event{ID: "1"}) // a failed event is not remembered: it runs again
	h(ctx, sdk.Event{ID: "1"}) // a handled one is not
	if runs != 2 {
		t.Fatalf("runs=%d, want 2", runs)
	}
	h(ctx, sdk.Event{ID: "2"})
	h(ctx, sdk.Event{ID: "3"}) // evicts 1
	if d.Seen("1") || !d.Seen("2") || !d.Seen("3") {
		t.Fatalf("window wrong: 1=%v 2=%v 3=%v", d.Seen("1"), d.Seen("2"), d.Seen("3"))
	}
}
