package vault

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/outbox"
)

// TestRecordOutbox: a secret record's waiting events are untrusted input like the rest of
// it: a record holding a bad one is refused.
func TestRecordOutbox(t *testing.T) {
	block, _ := aes.NewCipher(make([]byte, 32))
	aead, _ := cipher.NewGCM(block)
	v := &Vault{aead: aead}
	good := outbox.Event{ID: "01936b2e-1f00-7000-8000-000000000001", Action: "rotated", Body: json.RawMessage(`{"version":2}`)}
	rec := func(events ...outbox.Event) []byte {
		b, _ := json.Marshal(secretRecord{Owner: "shop", Name: "key", Outbox: events,
			Versions: []version{{Version: 1, Nonce: make([]byte, 12), Cipher: make([]byte, 32)}}})
		return b
	}
	if _, err := v.decodeRecord("secret.shop.key", rec(good)); err != nil {
		t.Fatalf("a good outbox: %v", err)
	}
	for name, c := range map[string]struct {
		events []outbox.Event
		want   string
	}{
		"not a UUIDv7":     {[]outbox.Event{{ID: "1", Action: "rotated", Body: good.Body}}, "UUIDv7"},
		"action not named": {[]outbox.Event{{ID: good.ID, Action: "Rotated!", Body: good.Body}}, "not one of"},
		"body not object":  {[]outbox.Event{{ID: good.ID, Action: "rotated", Body: json.RawMessage(`[1]`)}}, "JSON object"},
		"too many":         {make([]outbox.Event, outbox.Max+1), "more than"},
	} {
		if _, err := v.decodeRecord("secret.shop.key", rec(c.events...)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}
