package envelope_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/meshnode/meshnode/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// vector is one entry of testdata/vectors.json, the signing test vectors docs/envelope.md
// gives to implementers in other languages (examples/node checks them too).
type vector struct {
	Name         string `json:"name"`
	Seed         string `json:"seed"`
	PublicKey    string `json:"public_key"`
	EventID      string `json:"x_event_id"`
	Time         string `json:"x_time"`
	Subject      string `json:"subject"`
	Source       string `json:"x_source"`
	Body         string `json:"body"`
	BodySHA256   string `json:"body_sha256"`
	SigningInput string `json:"signing_input"`
	Signature    string `json:"x_signature"`
}

func readVectors(t *testing.T) []vector {
	t.Helper()
	b, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) == 0 {
		t.Fatal("no vectors")
	}
	return vs
}

// TestVectors: the published vectors are what this package computes: the signing input byte
// for byte, the public key of the seed, the signature (Ed25519 is deterministic), and Verify
// accepts it and refuses it for another body.
func TestVectors(t *testing.T) {
	for _, v := range readVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			if got := string(envelope.SigningInput(v.EventID, v.Time, v.Subject, v.Source, []byte(v.Body))); got != v.SigningInput {
				t.Fatalf("signing input\n%q\nwant\n%q", got, v.SigningInput)
			}
			kp, err := nkeys.FromSeed([]byte(v.Seed))
			if err != nil {
				t.Fatal(err)
			}
			if pub, _ := kp.PublicKey(); pub != v.PublicKey {
				t.Fatalf("public key %s, want %s", pub, v.PublicKey)
			}
			sk, err := envelope.NewSigningKey(kp)
			if err != nil {
				t.Fatal(err)
			}
			sig, _ := sk.Sign([]byte(v.SigningInput))
			h := nats.Header{}
			h.Set(envelope.EventID, v.EventID)
			h.Set(envelope.Time, v.Time)
			h.Set(envelope.Source, v.Source)
			h.Set(envelope.Signature, v.Signature)
			if err := envelope.Verify(h, v.Subject, []byte(v.Body), v.PublicKey); err != nil {
				t.Fatalf("the vector's signature does not verify: %v", err)
			}
			if got := base64.RawURLEncoding.EncodeToString(sig); got != v.Signature {
				t.Fatalf("signature %s, want %s", got, v.Signature)
			}
			if err := envelope.Verify(h, v.Subject, []byte(v.Body+" "), v.PublicKey); !errors.Is(err, envelope.ErrBadSignature) {
				t.Fatalf("another body verified: %v", err)
			}
		})
	}
}
