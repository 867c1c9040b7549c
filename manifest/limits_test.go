package manifest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

func TestLimits_Parsed(t *testing.T) {
	m, err := manifest.Check([]byte("module: shop\nlimits: {memory: 256MiB, processes: 64, cpu-weight: 200, disk: 2GiB}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := manifest.Limits{Memory: 256 << 20, Processes: 64, CPUWeight: 200, Disk: 2 << 30}
	if m.Limits != want {
		t.Fatalf("Limits=%+v, want %+v", m.Limits, want)
	}
}

func TestLimits_Refused(t *testing.T) {
	for _, tc := range []struct{ yaml, field, says string }{
		{"limits: {memory: 1MiB}", "limits.memory", "8MiB"},
		{"limits: {processes: 2}", "limits.processes", "at least 4"},
		{"limits: {cpu-weight: 20000}", "limits.cpu-weight", "1 to 10000"},
		{"limits: {disk: 10KiB}", "limits.disk", "1MiB"},
		{"limits: {memroy: 1GiB}", "limits.memroy", "write memory"},
		{"limits: {memory: lots}", "", "not a size"},
	} {
		_, err := manifest.Check([]byte("module: shop\n"+tc.yaml+"\n"), nil)
		var rs manifest.Refusals
		if !errors.As(err, &rs) {
			t.Fatalf("%s: %v, want refusals", tc.yaml, err)
		}
		found := false
		for _, r := range rs {
			if (tc.field == "" || r.Field == tc.field) && strings.Contains(r.Reason+" "+r.Instead, tc.says) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: refusals %v, want %s saying %q", tc.yaml, rs, tc.field, tc.says)
		}
	}
}
