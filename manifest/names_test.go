package manifest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// TestParseRetain_Bounded: a retain is at most 36500 days in all, whatever mix of units
// writes it; a longer one is refused naming the bound instead of wrapping round. Before,
// 36500d plus 2562047h overflowed time.Duration, and 36500d999999h was accepted.
func TestParseRetain_Bounded(t *testing.T) {
	bound := 36500 * 24 * time.Hour
	for _, in := range []string{"36500d", "36499d24h", "876000h", "36499d23h59m60s"} {
		if d, err := manifest.ParseRetain(in); err != nil || d != bound {
			t.Errorf("ParseRetain(%q)=%v, %v; want %v, the bound", in, d, err, bound)
		}
	}
	for _, in := range []string{
		"36500d1s", "36500d1h", "36500d999999h", "36500d2562047h", "36500d2562047h47m16s", "1d876000h",
		"876001h", "3000000h", "36501d", "4294967296d", "99999999999999999999d",
	} {
		d, err := manifest.ParseRetain(in)
		if err == nil {
			t.Errorf("ParseRetain(%q)=%v, want a refusal", in, d)
			continue
		}
		if !strings.Contains(err.Error(), "36500 days") {
			t.Errorf("ParseRetain(%q): %v; want it to name the bound, 36500 days", in, err)
		}
	}
}

// TestParseRetain_JetStreamMinimum: a retain under 100ms is refused where check sees it, as
// JetStream refuses the seat stream's MaxAge at register ("max age needs to be >= 100ms");
// 1ns passed check and failed register with JetStream's raw error.
func TestParseRetain_JetStreamMinimum(t *testing.T) {
	for _, in := range []string{"1ns", "99ms", "99999us"} {
		if d, err := manifest.ParseRetain(in); err == nil || !strings.Contains(err.Error(), "100ms") {
			t.Errorf("ParseRetain(%q)=%v, %v; want a refusal naming 100ms", in, d, err)
		}
	}
	if d, err := manifest.ParseRetain("100ms"); err != nil || d != manifest.MinRetain {
		t.Errorf("ParseRetain(100ms)=%v, %v; want %v", d, err, manifest.MinRetain)
	}
}
