package envelope_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/meshnode/meshnode/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// signedEvents are n events stamped by one key (events of many modules: keys of their own
// when keys > 1), with the public key each verifies with.
func signedEvents(tb testing.TB, n, keys int) []envelope.Signed {
	tb.Helper()
	type key struct {
		k   *envelope.SigningKey
		pub string
	}
	var ks []key
	for range keys {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		k, err := envelope.NewSigningKey(kp)
		if err != nil {
			tb.Fatal(err)
		}
		ks = append(ks, key{k, pub})
	}
	out := make([]envelope.Signed, n)
	for i := range out {
		k := ks[i%len(ks)]
		subject := "mesh.mod.a.event.x"
		body := fmt.Appendf(make([]byte, 0, 400), "%0400d", i)
		h, err := envelope.Stamp(k.k, "a", "n", subject, body, envelope.Options{})
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = envelope.Signed{Header: h, Subject: subject, Body: body, PublicKey: k.pub}
	}
	return out
}

// TestVerifyBatch_OneBadOfMany: in a batch of 32, one event whose body was changed after
// signing, one signed by another key than the one it is checked with, and one without a
// signature are each named, and the other 29 pass — what Verify says of each, one at a time.
func TestVerifyBatch_OneBadOfMany(t *testing.T) {
	events := signedEvents(t, 32, 3)
	events[5].Body = append([]byte("x"), events[5].Body...)
	events[17].PublicKey = events[16].PublicKey // events 16 and 17 are of different keys (i%3)
	events[30].Header = nats.Header(http.Header(events[30].Header).Clone())
	events[30].Header.Del(envelope.Signature)
	bad := map[int]bool{5: true, 17: true, 30: true}
	errs := envelope.VerifyBatch(events)
	if len(errs) != len(events) {
		t.Fatalf("%d answers for %d events", len(errs), len(events))
	}
	for i, err := range errs {
		if bad[i] != (err != nil) {
			t.Errorf("event %d: %v, bad %v", i, err, bad[i])
		}
		if err != nil && !errors.Is(err, envelope.ErrBadSignature) {
			t.Errorf("event %d: %v, want ErrBadSignature", i, err)
		}
		e := events[i]
		if alone := envelope.Verify(e.Header, e.Subject, e.Body, e.PublicKey); (alone == nil) != (err == nil) {
			t.Errorf("event %d: the batch says %v, Verify %v", i, err, alone)
		}
	}
	// A batch of one, and of none.
	if errs := envelope.VerifyBatch(events[5:6]); len(errs) != 1 || errs[0] == nil {
		t.Errorf("a bad event alone: %v", errs)
	}
	if errs := envelope.VerifyBatch(events[:1]); len(errs) != 1 || errs[0] != nil {
		t.Errorf("a good event alone: %v", errs)
	}
	if errs := envelope.VerifyBatch(nil); len(errs) != 0 {
		t.Errorf("no events: %v", errs)
	}
}

// BenchmarkVerify is the cost of a signature checked alone and in batches of 8 to 256 (an
// event's 400-byte body, one key as one module's burst; many keys as a mixed stream), beside
// crypto/ed25519's; ns/sig is per signature.
func BenchmarkVerify(b *testing.B) {
	for _, keys := range []int{1, 16} {
		events := signedEvents(b, 256, keys)
		b.Run(fmt.Sprintf("keys=%d/stdlib", keys), func(b *testing.B) {
			e := events[0]
			raw, _ := nkeys.FromPublicKey(e.PublicKey)
			for i := 0; i < b.N; i++ {
				if raw.Verify(envelope.SigningInput(e.Header.Get(envelope.EventID), e.Header.Get(envelope.Time), e.Subject, e.Header.Get(envelope.Source), e.Body),
					sigOf(b, e)) != nil {
					b.Fatal("does not verify")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/sig")
		})
		b.Run(fmt.Sprintf("keys=%d/alone", keys), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				e := events[i%len(events)]
				if envelope.Verify(e.Header, e.Subject, e.Body, e.PublicKey) != nil {
					b.Fatal("does not verify")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/sig")
		})
		for _, n := range []int{8, 32, 64, 256} {
			b.Run(fmt.Sprintf("keys=%d/batch=%d", keys, n), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					for _, err := range envelope.VerifyBatch(events[:n]) {
						if err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/sig")
			})
		}
	}
}

func sigOf(tb testing.TB, e envelope.Signed) []byte {
	sig, err := base64.RawURLEncoding.DecodeString(e.Header.Get(envelope.Signature))
	if err != nil || len(sig) != ed25519.SignatureSize {
		tb.Fatal(err)
	}
	return sig
}
