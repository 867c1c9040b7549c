package envelope

import (
	"crypto/rand"

	"github.com/nats-io/nats.go"
	voied "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// Signed is one event for VerifyBatch: what Verify takes.
type Signed struct {
	Header    nats.Header
	Subject   string
	Body      []byte
	PublicKey string
}

// VerifyBatch verifies each event as Verify does and returns Verify's answer for each (nil:
// genuine), in order. The signatures are checked together, with random weights, in one
// multiscalar multiplication (curve25519-voi's BatchVerifier); when that fails, each is
// checked alone, so one bad signature is named and the others still pass. A batch of one is
// verified alone. Per signature a batch of 8 costs about two thirds of one checked alone,
// one of 32 and more about half (BenchmarkVerify; docs/performance.md).
func VerifyBatch(events []Signed) []error {
	errs := make([]error, len(events))
	if len(events) == 1 {
		e := events[0]
		errs[0] = Verify(e.Header, e.Subject, e.Body, e.PublicKey)
		return errs
	}
	var (
		items []signedInput
		at    []int // items' events
	)
	for i, e := range events {
		pub, input, sig, err := prepare(e.Header, e.Subject, e.Body, e.PublicKey)
		if err != nil {
			errs[i] = err
			continue
		}
		items = append(items, signedInput{pub, input, sig})
		at = append(at, i)
	}
	for j, ok := range verifyAll(items) {
		if !ok {
			errs[at[j]] = ErrBadSignature
		}
	}
	return errs
}

// signedInput is one signature over input, with its key expanded.
type signedInput struct {
	pub        *voied.ExpandedPublicKey
	input, sig []byte
}

// verifyAll reports for each item whether its signature verifies under rule, the items
// checked together.
func verifyAll(items []signedInput) []bool {
	if len(items) == 0 {
		return nil
	}
	bv := voied.NewBatchVerifierWithCapacity(len(items))
	for _, it := range items {
		bv.AddExpandedWithOptions(it.pub, it.input, it.sig, rule)
	}
	_, valid := bv.Verify(rand.Reader)
	return valid
}
