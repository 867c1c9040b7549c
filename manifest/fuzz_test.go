package manifest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// FuzzManifest runs parse, validate, catalogue checks and derivation on arbitrary bytes. It
// must never panic, and whatever it derives must stay inside the module's own names. The
// seed corpus is testdata/fuzz/FuzzManifest plus the catalogue; plain `go test` runs it.
func FuzzManifest(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "catalogue", "*.yaml"))
	var catalogue []*manifest.Manifest
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		if m, err := manifest.Parse(data); err == nil {
			catalogue = append(catalogue, m)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Check runs the catalogue checks on invalid manifests too: they must not panic.
		cm, cerr := manifest.Check(data, catalogue)
		refusals(t, cerr)
		m, err := manifest.Parse(data)
		if err != nil {
			refusals(t, err)
			return
		}
		if cm == nil {
			t.Fatal("Check returned no manifest for YAML Parse accepts")
		}
		refusals(t, m.Validate())
		d, err := m.Derive()
		if err != nil {
			return
		}
		refusals(t, manifest.CheckCatalogue(m, catalogue, m))
		for _, s := range m.Seats {
			if _, err := d.HolderPermissions(s.Name, "n1"); err != nil {
				t.Fatalf("HolderPermissions(%s): %v", s.Name, err)
			}
			if _, _, err := d.SeatConsumer(s.Name, "n1"); err != nil {
				t.Fatalf("SeatConsumer(%s): %v", s.Name, err)
			}
		}
		for _, p := range d.Permissions.Publish {
			if strings.HasPrefix(p, "mesh.mod.") && !strings.HasPrefix(p, "mesh.mod."+m.Module+".event.") && p != manifest.StatsSubject(m.Module, "*") {
				t.Fatalf("%s may publish %q", m.Module, p)
			}
			if p == ">" || strings.HasPrefix(p, "mesh.*") || strings.HasPrefix(p, "$JS.API.>") {
				t.Fatalf("%s may publish %q", m.Module, p)
			}
		}
		for _, s := range d.Permissions.Subscribe {
			if !strings.HasPrefix(s.Subject, "_INBOX."+m.Module+".") && !strings.HasPrefix(s.Subject, "mesh.mod."+m.Module+".tool.") {
				t.Fatalf("%s may subscribe %q", m.Module, s.Subject)
			}
		}
	})
}
