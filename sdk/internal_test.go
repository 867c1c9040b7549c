package sdk

import (
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

func TestMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"mesh.mod.a.event.x", "mesh.mod.a.event.x", true},
		{"mesh.mod.*.event.x", "mesh.mod.b.event.x", true},
		{"mesh.mod.*.event.x", "mesh.mod.b.event.x.y", false},
		{"mesh.mod.a.event.>", "mesh.mod.a.event.x.y", true},
		{"mesh.mod.a.event.>", "mesh.mod.a.event", false},
		{"mesh.*.*.event.>", "mesh.seat.s.event.done", true},
		{"mesh.*.*.event.>", "mesh.mod.a.tool.status", false},
	} {
		if got := manifest.Matches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("Matches(%q, %q)=%v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}

func TestSubjectCovers(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"mesh.*.*.event.>", "mesh.mod.a.event.x", true},
		{"mesh.*.*.event.>", "mesh.mod.*.event.>", true},
		{"mesh.mod.a.event.>", "mesh.mod.*.event.x", false},
		{"mesh.mod.*.event.x", "mesh.mod.a.event.x", true},
		{"mesh.mod.a.event.x", "mesh.mod.a.event.x", true},
		{"mesh.mod.a.event.x", "mesh.mod.a.event.y", false},
		{"mesh.mod.a.event.x", "mesh.mod.a.event.>", false},
	} {
		if got := subjectCovers(tc.a, tc.b); got != tc.want {
			t.Errorf("subjectCovers(%q, %q)=%v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
