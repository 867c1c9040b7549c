package api_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
)

// TestGolden: each type marshals to the JSON captured from it before it moved here (from
// api.SeatInfo and api.Provision), so moving the wire did not change it.
func TestGolden(t *testing.T) {
	seat := api.SeatInfo{Seat: "mailer", Version: "v2", Scope: manifest.Scope("node"), Accepts: []string{"send"}, Serves: []string{"status"}, Emits: []string{"delivered"},
		Shapes:   map[string]*manifest.Shape{"send": {Type: "object"}},
		Versions: []api.SeatInfo{{Seat: "mailer", Version: "v3", Accepts: []string{"send"}}}}
	prov := api.Provision{Consumer: "billing", Interface: "postgres", Provider: "pg", State: "ready", Since: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC), Options: map[string]string{"size": "small"}, Generation: 3}
	for file, v := range map[string]any{
		"seat_info.json":      seat,
		"seat_info_zero.json": api.SeatInfo{},
		"provision.json":      prov,
		"provision_zero.json": api.Provision{},
	} {
		want, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if string(got)+"\n" != string(want) {
			t.Errorf("%s: got\n%s\nwant\n%s", file, got, want)
		}
	}
}

// TestSeatInfo_At: v1 is the info itself without its later versions; a later version is
// found among Versions; an unknown one is not.
func TestSeatInfo_At(t *testing.T) {
	s := manifest.Seat{Name: "mailer", Accepts: []string{"send"}}
	i := api.SeatInfoOf(s, "")
	i.Versions = []api.SeatInfo{{Seat: "mailer", Version: "v2", Accepts: []string{"send", "fax"}}}
	if v1, ok := i.At(manifest.V1); !ok || v1.Versions != nil || v1.Seat != "mailer" {
		t.Fatalf("At(v1) = %+v %v, want the seat without its versions", v1, ok)
	}
	if v2, ok := i.At("v2"); !ok || len(v2.Accepts) != 2 {
		t.Fatalf("At(v2) = %+v %v, want the later version", v2, ok)
	}
	if _, ok := i.At("v9"); ok {
		t.Fatal("At(v9) found a version the seat does not have")
	}
}
