package formats_test

import (
	"testing"

	"github.com/meshnode/meshnode/formats"
)

// TestAll: every format reads what it writes, and reads back to a version no newer than it.
func TestAll(t *testing.T) {
	for name, f := range formats.All() {
		if f.ReadsFrom < 1 || f.ReadsFrom > f.Writes {
			t.Errorf("%s: writes %d, reads from %d; want 1 <= reads_from <= writes", name, f.Writes, f.ReadsFrom)
		}
	}
}
