package suggest

import "testing"

func TestNearest(t *testing.T) {
	known := []string{"emits", "consumes", "log-level", "log-format"}
	for name, want := range map[string]string{
		"emit":       "emits",
		"consume":    "consumes",
		"log-levle":  "log-level",
		"log_format": "log-format",
		"tools":      "", // three edits or more from every known name
	} {
		if got := Nearest(name, known); got != want {
			t.Errorf("Nearest(%q)=%q, want %q", name, got, want)
		}
	}
}
