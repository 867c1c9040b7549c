package envelope

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/meshnode/meshnode/internal/boundedmap"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	voied "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// Header names (DESIGN §4).
const (
	EventID     = "x-event-id"     // UUIDv7, also the broker's Nats-Msg-Id
	Source      = "x-source"       // the emitting module, seat or node
	Node        = "x-node"         // the node the emitter was connected to
	Time        = "x-time"         // RFC 3339, UTC
	Causation   = "x-causation-id" // optional: the event that caused this one
	Schema      = "x-schema"       // optional: the payload's schema
	Signature   = "x-signature"    // base64url Ed25519 over SigningInput
	Traceparent = "traceparent"    // optional: W3C trace context, when the emitter has one
	// SeatEpoch is on the events of a seat a node holds (mesh-controller, the cascade's):
	// the epoch of the lease the signing node held. The audit log judges the signature
	// against that lease's holder, so a holder's late event stays genuine after a failover.
	SeatEpoch   = "x-seat-epoch"
	ContentType = "content-type"
	JSON        = "application/json"

	// Dead letters keep every original header and add these; only the node writes them.
	DeadReason     = "x-dead-reason"     // the client's term reason, else "max deliveries"
	DeadDeliveries = "x-dead-deliveries" // how many times the consumer had it
	DeadSubject    = "x-dead-subject"    // the original subject, as the stream stored it
	DeadConsumer   = "x-dead-consumer"   // the consumer that gave up
	DeadStream     = "x-dead-stream"     // that consumer's stream: EVENTS or SEAT_<seat>
	// DeadRawHeaders holds, base64, a header block the node could not decode (written by a
	// client that is not nats.go): the letter keeps it whole instead of losing the event.
	DeadRawHeaders = "x-dead-raw-headers"
)

// timeLayout is x-time's format: RFC 3339 with nanoseconds, UTC.
const timeLayout = time.RFC3339Nano

// Errors of reading an envelope.
var (
	// ErrMissingHeader means a required header is absent.
	ErrMissingHeader = errors.New("missing envelope header")
	// ErrBadSignature means x-signature does not verify against the emitter's key.
	ErrBadSignature = errors.New("signature does not verify")
)

// Signer signs the envelope: an nkeys.KeyPair is one, and so is SigningKey, which keeps the
// Ed25519 key expanded (nkeys rebuilds it from the seed on every Sign, which cost half the
// throughput of a synchronous emit).
type Signer interface {
	Sign(input []byte) ([]byte, error)
}

// SigningKey is a Signer holding the expanded Ed25519 private key of an nkey.
type SigningKey struct {
	priv   ed25519.PrivateKey
	prefix nkeys.PrefixByte // the kind of key: a user's, a server's…
}

// NewSigningKey expands kp's seed once for fast signing.
func NewSigningKey(kp nkeys.KeyPair) (*SigningKey, error) {
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	prefix, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	// curve25519-voi expands a seed in 10 µs where crypto/ed25519 takes 14 (both measured
	// here): a connect expands its module's seed once.
	return &SigningKey{priv: ed25519.PrivateKey(voied.NewKeyFromSeed(raw)), prefix: prefix}, nil
}

// PublicKey is the key's nkey public key ("U…" for a user's), without expanding it again.
func (k *SigningKey) PublicKey() (string, error) {
	b, err := nkeys.Encode(k.prefix, k.priv.Public().(ed25519.PublicKey))
	return string(b), err
}

// Sign signs input with the key. Ed25519 signatures are deterministic: curve25519-voi's
// signature is crypto/ed25519's, made in two thirds of the time.
func (k *SigningKey) Sign(input []byte) ([]byte, error) {
	return voied.Sign(voied.PrivateKey(k.priv), input), nil
}

// Options are the optional parts of an envelope.
type Options struct {
	// ID is the x-event-id of a retry: the UUIDv7 an earlier attempt of the same event was
	// stamped with. Empty means a new event.
	ID          string
	Causation   string // x-causation-id
	Schema      string // x-schema
	Traceparent string // traceparent; one that is not valid W3C trace context is left out
	SeatEpoch   uint64 // x-seat-epoch, on a node-held seat's event; 0: none
}

// MaxResendAge is how old an event's id may be when the event is published again under it:
// x-time is the id's own time, and consumers refuse an event whose x-time is far from when
// its stream stored it (the sdk's replay window, 10 minutes by default). An older event is
// published as a new one, caused by the first.
const MaxResendAge = 5 * time.Minute

// ErrBadEventID means an x-event-id is not a UUIDv7.
var ErrBadEventID = errors.New("x-event-id is not a UUIDv7")

// Stamp returns the headers of an envelope for body published on subject by source, signed
// with key. The event id is a fresh UUIDv7, or opts.ID for a retry. x-time is the id's own
// time (UUIDv7 holds it to the millisecond), so a retry of the same event carries the same
// headers and the same signature (Ed25519 is deterministic): the broker's dedup window and
// the audit log both see one event.
func Stamp(key Signer, source, node, subject string, body []byte, opts Options) (nats.Header, error) {
	var id uuid.UUID
	var err error
	if opts.ID != "" {
		id, err = ParseID(opts.ID)
	} else {
		id, err = uuid.NewV7()
	}
	if err != nil {
		return nil, fmt.Errorf("event id: %w", err)
	}
	now := IDTime(id).Format(timeLayout)
	sig, err := key.Sign(SigningInput(id.String(), now, subject, source, body))
	if err != nil {
		return nil, fmt.Errorf("sign event: %w", err)
	}
	h := nats.Header{}
	h.Set(EventID, id.String())
	h.Set(Source, source)
	h.Set(Node, node)
	h.Set(Time, now)
	h.Set(ContentType, JSON)
	h.Set(Signature, base64.RawURLEncoding.EncodeToString(sig))
	h.Set(nats.MsgIdHdr, id.String())
	if opts.Causation != "" {
		h.Set(Causation, opts.Causation)
	}
	if opts.Schema != "" {
		h.Set(Schema, opts.Schema)
	}
	if ValidTraceparent(opts.Traceparent) {
		h.Set(Traceparent, opts.Traceparent)
	}
	if opts.SeatEpoch != 0 {
		h.Set(SeatEpoch, strconv.FormatUint(opts.SeatEpoch, 10))
	}
	return h, nil
}

// NewIDAt is a fresh UUIDv7 holding t (to the millisecond) instead of the time now: the id
// of an event stamped by a process whose clock reads t.
func NewIDAt(t time.Time) (uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return id, err
	}
	ms := t.UnixMilli()
	for i := 5; i >= 0; i-- { // UUIDv7's first 48 bits: Unix milliseconds, big-endian
		id[i] = byte(ms)
		ms >>= 8
	}
	return id, nil
}

// ParseID parses an x-event-id, which must be a UUIDv7 in its canonical form.
func ParseID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil || id.Version() != 7 || id.String() != s {
		return uuid.UUID{}, fmt.Errorf("%w: %q", ErrBadEventID, s)
	}
	return id, nil
}

// IDTime is the time a UUIDv7 holds, in UTC.
func IDTime(id uuid.UUID) time.Time {
	sec, nsec := id.Time().UnixTime()
	return time.Unix(sec, nsec).UTC()
}

// SigningInput is what x-signature signs:
// x-event-id "\n" x-time "\n" subject "\n" x-source "\n" hex(sha256(body)).
func SigningInput(id, t, subject, source string, body []byte) []byte {
	sum := sha256.Sum256(body)
	return []byte(id + "\n" + t + "\n" + subject + "\n" + source + "\n" + hex.EncodeToString(sum[:]))
}

// Verify checks that h's signature over subject and body was made by publicKey, under the
// mesh's rule (Rule; docs/envelope.md): RFC 8032's cofactored verification with canonical
// encodings, FIPS 186-5's. It verifies with curve25519-voi, each key's expanded form kept
// (keys); VerifyBatch accepts exactly the same signatures, faster when there are many.
func Verify(h nats.Header, subject string, body []byte, publicKey string) error {
	pub, input, sig, err := prepare(h, subject, body, publicKey)
	if err != nil {
		return err
	}
	if !voied.VerifyExpandedWithOptions(pub, input, sig, rule) {
		return ErrBadSignature
	}
	return nil
}

// prepare is what Verify verifies: the expanded key, the signing input and the signature.
func prepare(h nats.Header, subject string, body []byte, publicKey string) (*voied.ExpandedPublicKey, []byte, []byte, error) {
	pub, err := expanded(publicKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("verify: %w", err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(h.Get(Signature))
	if err != nil || len(sig) == 0 {
		return nil, nil, nil, fmt.Errorf("%w: x-signature is missing or not base64url", ErrBadSignature)
	}
	return pub, SigningInput(h.Get(EventID), h.Get(Time), subject, h.Get(Source), body), sig, nil
}

// Rule names the signature rule every verifier in the mesh applies (docs/envelope.md):
// S below the group order, A and R canonically encoded, and [8][S]B = [8]R + [8][k]A.
// Batch verification needs the cofactored equation; crypto/ed25519's cofactorless one
// accepts a subset (it refuses the crafted signatures testdata/ed25519-edge.json lists).
const Rule = "ed25519-fips-186-5"

// rule is Rule in curve25519-voi's terms.
var rule = &voied.Options{Verify: voied.VerifyOptionsFIPS_186_5}

// expandedKeys are the public keys Verify has expanded, by nkey. Verify is given registered
// keys only (the registry's, the vault's, the nodes'), so the cache stays small; it starts
// again past 16,384 all the same.
var expandedKeys = boundedmap.New[string, *voied.ExpandedPublicKey](1 << 14)

func expanded(publicKey string) (*voied.ExpandedPublicKey, error) {
	if x, ok := expandedKeys.Get(publicKey); ok {
		return x, nil
	}
	if !nkeys.IsValidPublicKey(publicKey) {
		return nil, nkeys.ErrInvalidPublicKey
	}
	raw, err := nkeys.Decode(nkeys.Prefix(publicKey), []byte(publicKey))
	if err != nil {
		return nil, err
	}
	x, err := voied.NewExpandedPublicKey(voied.PublicKey(raw))
	if err != nil {
		// Not a point on the curve: nothing verifies against it, as crypto/ed25519 says.
		return nil, fmt.Errorf("%w: %w", ErrBadSignature, err)
	}
	expandedKeys.Put(publicKey, x)
	return x, nil
}

// Event is an envelope read back: the typed headers, the subject and the payload.
type Event struct {
	// Key is the event's name as a manifest writes it: "<emitter>.<event>".
	Key       string
	Subject   string
	ID        string
	Source    string
	Node      string
	Time      time.Time
	Causation string
	Schema    string
	Data      []byte
	// Header holds every header, unknown x- headers included.
	Header nats.Header
}

// Read parses the envelope of a message. A missing required header is an error naming it;
// unknown headers are kept in Header.
func Read(subject string, h nats.Header, data []byte) (Event, error) {
	e := Event{
		Key: Key(subject), Subject: subject, Data: data, Header: h,
		ID: h.Get(EventID), Source: h.Get(Source), Node: h.Get(Node),
		Causation: h.Get(Causation), Schema: h.Get(Schema),
	}
	for _, name := range []string{EventID, Source, Time} {
		if h.Get(name) == "" {
			return e, fmt.Errorf("%w %s on %s", ErrMissingHeader, name, subject)
		}
	}
	t, err := time.Parse(time.RFC3339Nano, h.Get(Time))
	if err != nil {
		return e, fmt.Errorf("x-time %q on %s: %w", h.Get(Time), subject, err)
	}
	e.Time = t
	return e, nil
}

// StoredSize is what one message costs a stream, near enough, as the mesh counts a module's
// use of EVENTS (the admitter before it passes an event on, the audit log once it records it;
// both must count alike): subject, headers and body.
func StoredSize(subject string, h nats.Header, data []byte) int64 {
	n := len(subject) + len(data)
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4 // "k: v\r\n"
		}
	}
	return int64(n)
}
