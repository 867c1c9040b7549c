package api_test

import (
	"testing"

	"github.com/meshnode/meshnode/api"
)

// TestOverRatePace: the pace an over-rate refusal names is read back exactly, and a
// description that names none (another refusal's, an older admitter's) reads as none.
func TestOverRatePace(t *testing.T) {
	for _, pace := range []float64{300, 2000, 0.5, 12345.25} {
		got, ok := api.OverRatePace(api.OverRateDescription("shop", pace))
		if !ok || got != pace {
			t.Errorf("pace %g: read %g %v", pace, got, ok)
		}
	}
	for _, d := range []string{"", "module shop holds 1 MiB of EVENTS", "its pace of many a second", "its pace of -3 a second"} {
		if got, ok := api.OverRatePace(d); ok {
			t.Errorf("%q: read a pace %g", d, got)
		}
	}
}
