package envelope_test

import (
	"testing"

	"github.com/meshnode/meshnode/envelope"
)

func TestTraceparent(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, c := range []struct {
		tp   string
		want bool
	}{
		{tp, true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{"", false},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false}, // another version
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false}, // upper case
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false}, // zero trace
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false}, // zero span
		{"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", false},  // short trace
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", false},
	} {
		if got := envelope.ValidTraceparent(c.tp); got != c.want {
			t.Errorf("ValidTraceparent(%q) = %v", c.tp, got)
		}
	}
	child := envelope.ChildTraceparent(tp)
	if !envelope.ValidTraceparent(child) || child[:36] != tp[:36] || child[52:] != tp[52:] || child[36:52] == tp[36:52] {
		t.Errorf("child %q of %q: want the same trace and flags, a new span", child, tp)
	}
	if envelope.ChildTraceparent("garbage") != "" {
		t.Error("a child of an invalid traceparent")
	}
}
