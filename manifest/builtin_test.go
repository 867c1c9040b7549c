package manifest_test

import (
	"slices"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// TestBuiltin_DerivedLikeAnyModule: the mesh's own seats come out of the same derivation as
// a module's — the controller's report verb has its work queue and consumer, the vault's
// tools their subjects — and a module may replace mesh-git with the whole protocol.
func TestBuiltin_DerivedLikeAnyModule(t *testing.T) {
	d := manifest.Builtin()
	if d.Module != manifest.BuiltinModule {
		t.Fatalf("module %q, want %q", d.Module, manifest.BuiltinModule)
	}
	var names []string
	for _, s := range d.Seats {
		names = append(names, s.Name)
	}
	want := []string{"mesh-build-machine", "mesh-controller", "mesh-git", "mesh-vault"}
	if !slices.Equal(names, want) {
		t.Fatalf("seats %v, want %v", names, want)
	}
	ctrl := d.Seats[slices.Index(names, manifest.ControllerSeat)]
	if ctrl.Stream == nil || ctrl.Consumer == nil {
		t.Fatal("mesh-controller accepts report but has no work queue")
	}
	if len(ctrl.Accepts) != 1 || ctrl.Accepts[0].Subject != manifest.SeatAcceptSubject(manifest.ControllerSeat, "report") {
		t.Fatalf("mesh-controller accepts %+v", ctrl.Accepts)
	}
	if v := d.Seats[slices.Index(names, manifest.VaultSeat)]; v.Stream != nil {
		t.Fatal("mesh-vault accepts nothing, yet has a work queue")
	}
	git, _ := manifest.BuiltinSeat("mesh-git")
	m, err := manifest.Parse([]byte("module: forge\nrequires: [mesh-bus]\nseats:\n  mesh-git:\n    scope: mesh\n    emits: [pushed, tagged]\n    serves: [archive]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("a module replacing mesh-git with its whole protocol and more: %v", err)
	}
	if len(git.Emits) != 1 || git.Emits[0] != "pushed" {
		t.Fatalf("mesh-git emits %v", git.Emits)
	}
}
