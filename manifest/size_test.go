package manifest_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// TestCheck_Size: a manifest over MaxSize is refused by Check and Derive, naming its size and
// the limit; one at the limit passes. Before, a 760 KB manifest was valid.
func TestCheck_Size(t *testing.T) {
	head := "module: big\nrequires: [mesh-bus]\n"
	pad := func(n int) []byte { return []byte(head + strings.Repeat("#", n-len(head)-1) + "\n") }

	if _, err := manifest.Check(pad(manifest.MaxSize), nil); err != nil {
		t.Fatalf("a manifest of exactly MaxSize: %v", err)
	}
	over := pad(760_000)
	_, err := manifest.Check(over, nil)
	var rs manifest.Refusals
	if !errors.As(err, &rs) || len(rs) != 1 || rs[0].Code != manifest.CodeSize {
		t.Fatalf("Check of 760 KB: %v, want one size refusal", err)
	}
	for _, want := range []string{strconv.Itoa(len(over)), strconv.Itoa(manifest.MaxSize)} {
		if !strings.Contains(rs[0].Error(), want) {
			t.Errorf("refusal %q does not name %s", rs[0].Error(), want)
		}
	}
	m, err := manifest.Parse(over)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Derive(); !errors.As(err, &rs) || rs[0].Code != manifest.CodeSize {
		t.Fatalf("Derive of 760 KB: %v, want a size refusal", err)
	}
	if err := manifest.CheckSize(manifest.MaxSize + 1); err == nil {
		t.Fatal("CheckSize(MaxSize+1) passed")
	}
}
