// Package deadletter reads the mesh's dead letters (stream DEAD) and replays them: it checks
// that a letter is what its source could have published itself before publishing it again
// with the caller's (the operator's) authority. The CLI's `dead` verbs and the dashboard use
// it. Each node writes them (Writer, writer.go).
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// FromMsg reads a message of DEAD.
func FromMsg(m *jetstream.RawStreamMsg) api.DeadLetter {
	d, _ := strconv.Atoi(m.Header.Get(envelope.DeadDeliveries))
	return api.DeadLetter{ID: m.Sequence, Time: m.Time, Subject: m.Header.Get(envelope.DeadSubject),
		Consumer: m.Header.Get(envelope.DeadConsumer), Reason: m.Header.Get(envelope.DeadReason), Deliveries: d,
		EventID: m.Header.Get(envelope.EventID), Headers: map[string][]string(m.Header), Body: m.Data}
}

// List reads every dead letter, oldest first.
func List(ctx context.Context, dead jetstream.Stream) ([]api.DeadLetter, error) {
	info, err := dead.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []api.DeadLetter
	if info.State.Msgs == 0 {
		return out, nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := dead.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // dropped or replayed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, FromMsg(m))
	}
	return out, nil
}

// Newest reads the newest n dead letters, newest first, and how many DEAD holds: it walks
// back from the last sequence, so a long history of replayed letters costs nothing.
func Newest(ctx context.Context, dead jetstream.Stream, n int) ([]api.DeadLetter, int, error) {
	info, err := dead.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	var out []api.DeadLetter
	for seq := info.State.LastSeq; seq >= info.State.FirstSeq && seq > 0 && len(out) < n && uint64(len(out)) < info.State.Msgs; seq-- {
		m, err := dead.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // dropped or replayed
		}
		if err != nil {
			return nil, 0, err
		}
		out = append(out, FromMsg(m))
	}
	return out, int(info.State.Msgs), nil
}

// ListModules asks the controller for every registered module: admin.List, which deadletter
// is handed rather than importing (admin, a client of the controller, is a layer above).
type ListModules func(ctx context.Context, nc *nats.Conn) ([]api.ModuleInfo, error)

// LoadAuthority learns what every registered module (from list), server and the vault may
// publish: what Replay checks a letter against.
func LoadAuthority(ctx context.Context, js jetstream.JetStream, list ListModules) (Authority, error) {
	mods, err := list(ctx, js.Conn())
	if err != nil {
		return nil, fmt.Errorf("learn the registered modules, to check what a letter's source may publish: %w", err)
	}
	auth := AuthorityOf(mods)
	if err := auth.signersOf(ctx, js); err != nil {
		return nil, fmt.Errorf("learn the servers' and the vault's keys, to check a letter's signature: %w", err)
	}
	return auth, nil
}

// Replay republishes a dead letter's original event and then deletes the dead letter. It
// refuses a letter its source could not have published (replayable), keeping it.
func Replay(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream, m *jetstream.RawStreamMsg, auth Authority) error {
	subject := m.Header.Get(envelope.DeadSubject)
	if err := replayable(m.Header, m.Data, auth); err != nil {
		return fmt.Errorf("%w: dead letter %d: %v; it is kept (`meshnode dead drop %d` removes it)", ErrNotReplayable, m.Sequence, err, m.Sequence)
	}
	h := nats.Header{}
	for k, v := range m.Header {
		if !strings.HasPrefix(strings.ToLower(k), "x-dead-") {
			h[k] = v
		}
	}
	// The broker's dedup window would drop a copy under the original Nats-Msg-Id; the event
	// keeps its x-event-id, which is what consumers and the audit log deduplicate on.
	h.Set(nats.MsgIdHdr, fmt.Sprintf("replay.%d.%s", m.Sequence, h.Get(envelope.EventID)))
	target, err := replayTarget(ctx, js, m, subject)
	if err != nil {
		return err
	}
	// A duplicate ack means an earlier replay of this very letter was stored (and the letter
	// not removed): the event is back in its stream either way.
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: target, Header: h, Data: m.Data}); err != nil {
		return fmt.Errorf("replay %d to %s: %w; the dead letter is kept", m.Sequence, subject, err)
	}
	if err := dead.DeleteMsg(ctx, m.Sequence); err != nil {
		return fmt.Errorf("replayed %d, but could not remove it from DEAD: %w", m.Sequence, err)
	}
	return nil
}

// replayTarget is where a letter's event is published again. An event goes to the one
// consumer that gave up on it (DESIGN §3), on its replay subject, which no other consumer's
// filter matches; that consumer must still exist, or nobody would get the event. A job goes
// back to its seat's work queue, which has one consumer.
func replayTarget(ctx context.Context, js jetstream.JetStream, m *jetstream.RawStreamMsg, subject string) (string, error) {
	if !manifest.IsEvent(subject) {
		return subject, nil
	}
	consumer := m.Header.Get(envelope.DeadConsumer)
	if !manifest.ValidName(consumer) {
		return "", fmt.Errorf("%w: dead letter %d names consumer %q, which is not a module's; it is kept (`meshnode dead drop %d` removes it)",
			ErrNotReplayable, m.Sequence, consumer, m.Sequence)
	}
	c, err := js.Consumer(ctx, manifest.EventsStreamName, consumer)
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return "", fmt.Errorf("%w: dead letter %d: module %s no longer consumes events (removed, or its consumes changed), so nobody would get it; it is kept (`meshnode dead drop %d` removes it)",
				ErrNotReplayable, m.Sequence, consumer, m.Sequence)
		}
		return "", fmt.Errorf("look up consumer %s: %w; the dead letter is kept", consumer, err)
	}
	// The consumer must deliver the replay (a node that has not reconciled it yet would leave
	// the event where nobody reads it) and still consume the event (its consumes may have
	// changed since).
	filters := c.CachedInfo().Config.FilterSubjects
	replays, consumes := false, false
	for _, f := range filters {
		replays = replays || f == manifest.ReplayFilter(consumer)
		consumes = consumes || f != manifest.ReplayFilter(consumer) && manifest.Matches(f, subject)
	}
	switch {
	case !replays:
		return "", fmt.Errorf("%w: dead letter %d: consumer %s has no replay filter yet (a node not upgraded, or not reconciled: `meshnode status`), so nobody would get it; it is kept",
			ErrNotReplayable, m.Sequence, consumer)
	case !consumes:
		return "", fmt.Errorf("%w: dead letter %d: module %s no longer consumes %s (its consumes changed), so it would be refused; it is kept (`meshnode dead drop %d` removes it)",
			ErrNotReplayable, m.Sequence, consumer, envelope.Key(subject), m.Sequence)
	}
	return manifest.ReplaySubject(consumer, subject), nil
}

// ErrNotReplayable marks a dead letter replay refuses: publishing it with the operator's
// authority would say more than its source may.
var ErrNotReplayable = errors.New("not replayed")

// Authority is what each registered module may publish, from the controller's list:
// what `dead replay` checks a letter against before publishing it as the operator.
type Authority map[string]replaySource

// replaySource is one registered module's authority.
type replaySource struct {
	publicKey string
	emits     []string
	uses      []string
	pins      map[string]string        // the later seat protocol versions it speaks
	seats     map[string]manifest.Seat // the seats it declares
}

// Keys of Authority that are not modules (a colon is in no module name): a server's key,
// and the key that signs the mesh's own seat's events.
func nodeSigner(node string) string { return "node:" + node }
func seatSigner(seat string) string { return "seat:" + seat }

// signersOf adds the servers' keys and the vault's, from the registry's bucket, so a node's
// or the vault's event is replayed only with their signature.
func (a Authority) signersOf(ctx context.Context, js jetstream.JetStream) error {
	kv, err := js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		return err
	}
	if e, err := kv.Get(ctx, "identity.vault"); err == nil && nkeys.IsValidPublicUserKey(string(e.Value())) {
		a[seatSigner(manifest.VaultSeat)] = replaySource{publicKey: string(e.Value())}
	}
	keys, err := kv.ListKeysFiltered(ctx, "identity.node.*")
	if err != nil {
		return err
	}
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue
		}
		var id registry.NodeIdentity
		if json.Unmarshal(e.Value(), &id) == nil && id.PublicKey != "" {
			a[nodeSigner(strings.TrimPrefix(key, "identity.node."))] = replaySource{publicKey: id.PublicKey}
		}
	}
	return nil
}

// authorityOf reads the registered modules' authority. A manifest that does not parse
// contributes its events but no seats.
func AuthorityOf(mods []api.ModuleInfo) Authority {
	auth := Authority{}
	for _, m := range mods {
		src := replaySource{publicKey: m.PublicKey, emits: m.Emits, uses: m.Uses, pins: m.Pins, seats: map[string]manifest.Seat{}}
		if mf, err := manifest.Parse([]byte(m.Manifest)); err == nil {
			for _, s := range mf.Seats {
				src.seats[s.Name] = s
			}
		}
		auth[m.Module] = src
	}
	return auth
}

// declarer returns the module that declares seat.
func (a Authority) declarer(seat string) (string, replaySource, bool) {
	for name, src := range a {
		if _, ok := src.seats[seat]; ok {
			return name, src, true
		}
	}
	return "", replaySource{}, false
}

// replayable returns nil when a dead letter's original subject (x-dead-subject) is one its
// source (x-source) may publish on itself, so that replaying it as the operator adds no
// authority: a module's own declared event; a seat's declared event by the module that
// declares the seat (or under the seat's name); a job a module may submit to a seat it uses
// or declares; a node's own event; an event of one of the mesh's own seats under that seat's
// name. A module's event or job must carry a signature by that module's registered key.
// Anything else — a JetStream API or KV subject, a tool, another's namespace — is refused.
func replayable(h nats.Header, body []byte, auth Authority) error {
	subjects, sources := h.Values(envelope.DeadSubject), h.Values(envelope.Source)
	if len(subjects) != 1 || subjects[0] == "" {
		return fmt.Errorf("it names %d original subjects (%s), want one", len(subjects), envelope.DeadSubject)
	}
	if len(sources) != 1 || sources[0] == "" {
		return fmt.Errorf("it names %d sources (%s), want one", len(sources), envelope.Source)
	}
	subject, source := subjects[0], sources[0]
	toks := strings.Split(subject, ".")
	if len(toks) < 5 || toks[0] != "mesh" || slices.ContainsFunc(toks[1:], func(t string) bool { return !manifest.ValidName(t) }) {
		return fmt.Errorf("%s is not a subject of the mesh's events or jobs", subject)
	}
	kind, owner, rest := toks[1], toks[2], toks[3:]
	// signed checks that the letter carries src's signature over what it would republish.
	signed := func(name string, src replaySource) error {
		if err := envelope.Verify(h, subject, body, src.publicKey); err != nil {
			return fmt.Errorf("its signature is not %s's: %w", name, err)
		}
		return nil
	}
	switch {
	case kind == "mod" && rest[0] == "event":
		event := strings.Join(rest[1:], ".")
		src, ok := auth[source]
		switch {
		case source != owner:
			return fmt.Errorf("%s is module %s's event, and the letter's source is %s", subject, owner, source)
		case !ok:
			return fmt.Errorf("module %s is not registered", source)
		case !slices.Contains(src.emits, event):
			return fmt.Errorf("module %s does not emit %s (it emits %v)", source, event, src.emits)
		}
		return signed(source, src)
	case kind == "node" && rest[0] == "event":
		if source != owner {
			return fmt.Errorf("%s is node %s's event, and the letter's source is %s", subject, owner, source)
		}
		src, ok := auth[nodeSigner(owner)]
		if !ok {
			return fmt.Errorf("%s is not a server of the mesh", owner)
		}
		return signed("server "+owner, src)
	case kind == "seat":
		return replayableSeat(subject, source, auth, signed)
	}
	return fmt.Errorf("%s is not a subject of the mesh's events or jobs", subject)
}

// replayableSeat is replayable for a seat's subject, of any version of its protocol: an
// event the seat emits in that version, under the seat's or its declarer's name; a job the
// seat takes in that version, from a module that declares the seat or uses it at that version.
func replayableSeat(subject, source string, auth Authority, signed func(string, replaySource) error) error {
	ss, ok := manifest.ParseSeatSubject(subject)
	if !ok {
		return fmt.Errorf("%s is not a subject of the mesh's events or jobs", subject)
	}
	owner := ss.Seat
	switch ss.Kind {
	case "event":
		if strings.HasPrefix(owner, "mesh-") {
			if source != owner {
				return fmt.Errorf("%s is the mesh's seat %s's event, and the letter's source is %s", subject, owner, source)
			}
			src, ok := auth[seatSigner(owner)]
			if !ok {
				return fmt.Errorf("the mesh's seat %s has no known signing key", owner)
			}
			return signed(owner, src)
		}
		name, src, ok := auth.declarer(owner)
		if !ok {
			return fmt.Errorf("no registered module declares seat %s", owner)
		}
		at, has := src.seats[owner].At(ss.Version)
		switch {
		case source != owner && source != name:
			return fmt.Errorf("%s is seat %s's event (declared by %s), and the letter's source is %s", subject, owner, name, source)
		case !has || !slices.Contains(at.Emits, ss.Name):
			return fmt.Errorf("seat %s does not emit %s in %s (it emits %v)", owner, ss.Name, ss.Version, at.Emits)
		}
		return signed(name, src)
	case "accept":
		src, ok := auth[source]
		if !ok {
			return fmt.Errorf("module %s is not registered", source)
		}
		_, declares := src.seats[owner]
		switch {
		case !declares && !slices.Contains(src.uses, owner):
			return fmt.Errorf("module %s neither uses nor declares seat %s", source, owner)
		case !declares && manifest.NormalVersion(src.pins[owner]) != ss.Version:
			return fmt.Errorf("module %s speaks %s of seat %s, not %s", source, manifest.NormalVersion(src.pins[owner]), owner, ss.Version)
		}
		_, decl, ok := auth.declarer(owner)
		at, has := decl.seats[owner].At(ss.Version)
		if !ok || !has || !slices.Contains(at.Accepts, ss.Name) || (ss.Node != "") != (at.Scope == manifest.ScopeNode) {
			return fmt.Errorf("seat %s takes no %s job on %s", owner, ss.Name, subject)
		}
		return signed(source, src)
	}
	return fmt.Errorf("%s is not a subject of the mesh's events or jobs", subject)
}
