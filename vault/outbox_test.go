package vault

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCheckOutbox: a record's waiting events are untrusted input like the rest of it.
func TestCheckOutbox(t *testing.T) {
	good := outboxEvent{ID: "01936b2e-1f00-7000-8000-000000000001", Action: "rotated", Body: json.RawMessage(`{"version":2}`)}
	if err := checkOutbox([]outboxEvent{good}); err != nil {
		t.Fatalf("a good outbox: %v", err)
	}
	for name, c := range map[string]struct {
		events []outboxEvent
		want   string
	}{
		"not a UUIDv7":     {[]outboxEvent{{ID: "1", Action: "rotated", Body: good.Body}}, "UUIDv7"},
		"action not named": {[]outboxEvent{{ID: good.ID, Action: "Rotated!", Body: good.Body}}, "not a name"},
		"body not object":  {[]outboxEvent{{ID: good.ID, Action: "rotated", Body: json.RawMessage(`[1]`)}}, "JSON object"},
		"too many":         {make([]outboxEvent, maxOutbox+1), "more than"},
	} {
		if err := checkOutbox(c.events); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}
