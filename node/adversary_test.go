package node_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// The adversary's own bed suite (issue 11): every JetStream API verb, every bucket, other
// modules' inboxes, header bombs and bounded floods, each tried against a real node the way a
// registered module, a seat holder or a join token's bearer could. The tables are written
// here by hand from nats-server v2.15.2's server/jetstream_api.go, never computed by the code
// under test.

// meshStreams are the streams and buckets every node has (DESIGN §3).
var meshStreams = []string{"EVENTS", "DEAD", "STATE", "KV_mesh-registry", "KV_mesh-seats", "KV_mesh-vault"}

// jsAPIStreamVerbs are nats-server's per-stream API subjects (%s: the stream): JSApiStream*,
// JSApiMsg*, JSDirectMsgGet*, JSApiConsumerCreate*, JSApiDurableCreate, JSApiConsumers,
// JSApiConsumerList and the stream peer, move and leader verbs.
var jsAPIStreamVerbs = []string{
	"$JS.API.STREAM.CREATE.%s",
	"$JS.API.STREAM.UPDATE.%s",
	"$JS.API.STREAM.INFO.%s",
	"$JS.API.STREAM.DELETE.%s",
	"$JS.API.STREAM.PURGE.%s",
	"$JS.API.STREAM.SNAPSHOT.%s",
	"$JS.API.STREAM.RESTORE.%s",
	"$JS.API.STREAM.MSG.DELETE.%s",
	"$JS.API.STREAM.MSG.GET.%s",
	"$JS.API.DIRECT.GET.%s",
	"$JS.API.DIRECT.GET.%s.mesh.mod.probe.event.tick",
	"$JS.API.CONSUMER.CREATE.%s",
	"$JS.API.CONSUMER.CREATE.%s.spy.mesh.mod.src.event.tick",
	"$JS.API.CONSUMER.CREATE.%s.probe.mesh.mod.src.event.tick",
	"$JS.API.CONSUMER.DURABLE.CREATE.%s.spy",
	"$JS.API.CONSUMER.DURABLE.CREATE.%s.probe",
	"$JS.API.CONSUMER.NAMES.%s",
	"$JS.API.CONSUMER.LIST.%s",
	"$JS.API.STREAM.PEER.REMOVE.%s",
	"$JS.API.STREAM.PEER.EVACUATE.%s",
	"$JS.API.STREAM.CANCEL_MOVE.%s",
	"$JS.API.STREAM.LEADER.STEPDOWN.%s",
	"$JS.API.ACCOUNT.STREAM.MOVE.$G.%s",
	"$JS.API.ACCOUNT.STREAM.CANCEL_MOVE.$G.%s",
}

// jsAPIConsumerVerbs are the per-consumer subjects (%[1]s the stream, %[2]s the consumer):
// JSApiConsumerInfo, Delete, Pause, RequestNext, Reset, Unpin, the leader and peer verbs, and
// the acks, flow control and snapshot acks the server listens on.
var jsAPIConsumerVerbs = []string{
	"$JS.API.CONSUMER.INFO.%[1]s.%[2]s",
	"$JS.API.CONSUMER.DELETE.%[1]s.%[2]s",
	"$JS.API.CONSUMER.PAUSE.%[1]s.%[2]s",
	"$JS.API.CONSUMER.MSG.NEXT.%[1]s.%[2]s",
	"$JS.API.CONSUMER.RESET.%[1]s.%[2]s",
	"$JS.API.CONSUMER.UNPIN.%[1]s.%[2]s",
	"$JS.API.CONSUMER.LEADER.STEPDOWN.%[1]s.%[2]s",
	"$JS.API.CONSUMER.PEER.REMOVE.%[1]s.%[2]s",
	"$JS.API.CONSUMER.PEER.EVACUATE.%[1]s.%[2]s",
	"$JS.ACK.%[1]s.%[2]s.1.1.1.1.1",
	"$JS.FC.%[1]s.%[2]s.x",
	"$JS.SNAPSHOT.ACK.%[1]s.%[2]s",
	"$JS.SNAPSHOT.RESTORE.%[1]s.%[2]s",
}

// jsAPIAccountVerbs are the account- and server-wide subjects.
var jsAPIAccountVerbs = []string{
	"$JS.API.INFO",
	"$JS.API.STREAM.NAMES",
	"$JS.API.STREAM.LIST",
	"$JS.API.META.LEADER.STEPDOWN",
	"$JS.API.META.RESCUE",
	"$JS.API.SERVER.REMOVE",
	"$JS.API.SERVER.EVACUATE",
	"$JS.API.ACCOUNT.PURGE.$G",
	"$JS.API.STREAM.CREATE.PROBE",
	"$JS.API.CONSUMER.CREATE.SEAT_work",
	"$JS.API.CONSUMER.MSG.NEXT.SEAT_work.seat-work",
	"$JS.ACK.SEAT_work.seat-work.1.1.1.1.1",
	"$JS.mesh.API.INFO",         // a JetStream domain prefix
	"$JS.alpha.API.STREAM.LIST", // the node's name as a domain
	"$SYS.REQ.SERVER.PING",
	"$SYS.REQ.ACCOUNT.$G.CONNZ",
}

// probeGranted is everything of the JetStream API a consuming module named probe may use:
// its own consumer's info and next-message request, and acks of what it was delivered.
var probeGranted = map[string]bool{
	"$JS.API.CONSUMER.INFO.EVENTS.probe":     true,
	"$JS.API.CONSUMER.MSG.NEXT.EVENTS.probe": true,
	"$JS.ACK.EVENTS.probe.1.1.1.1.1":         true,
}

// TestAdversary_JetStreamAPI: every JetStream API verb, on every mesh stream and consumer,
// is refused to a registered module with a permissions violation — except exactly the three
// a consuming module needs for its own consumer.
func TestAdversary_JetStreamAPI(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: src\nrequires: [mesh-bus]\nemits: [tick]\nseats:\n  work: {scope: mesh, retain: 1h, accepts: [do]}\n")
	b.register("module: other\nrequires: [mesh-bus]\nconsumes: [src.tick]\n")
	seed, _ := b.register("module: probe\nrequires: [mesh-bus]\nconsumes: [src.tick]\nemits: [tick]\n")
	nc := b.raw(seed, "probe")

	var subjects []string
	for _, s := range meshStreams {
		for _, v := range jsAPIStreamVerbs {
			subjects = append(subjects, fmt.Sprintf(v, s))
		}
		for _, c := range []string{"probe", "other", manifest.AuditConsumer("alpha").Name, "spy"} {
			for _, v := range jsAPIConsumerVerbs {
				subjects = append(subjects, fmt.Sprintf(v, s, c))
			}
		}
	}
	subjects = append(subjects, jsAPIAccountVerbs...)

	granted := map[string]bool{}
	for _, subj := range subjects {
		refused := refusedPub(t, nc, subj)
		switch {
		case probeGranted[subj] && refused:
			t.Errorf("%s refused: the module's own consumer needs it", subj)
		case probeGranted[subj]:
			granted[subj] = true
		case !refused:
			t.Errorf("%s allowed to a module", subj)
		}
	}
	if len(granted) != len(probeGranted) {
		t.Errorf("probed the grants %v, want all of %v", granted, probeGranted)
	}
	// Listening in on the API, its advisories or the system account is refused too.
	for _, subj := range []string{"$JS.API.>", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.other", "$JS.EVENT.>", "$JS.EVENT.ADVISORY.>",
		"$JS.ACK.>", "$JS.ACK.EVENTS.other.>", "$KV.>", "$SYS.>", "mesh.dead.>"} {
		if !refusedSub(t, nc, subj, "") {
			t.Errorf("subscribe on %s allowed to a module", subj)
		}
	}
	// Nothing the probes asked for happened.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range meshStreams {
		if _, err := b.js.Stream(ctx, s); err != nil {
			t.Errorf("stream %s after the probes: %v", s, err)
		}
	}
	if _, err := b.js.Stream(ctx, "PROBE"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a probe created stream PROBE: %v", err)
	}
	if _, err := b.js.Consumer(ctx, "EVENTS", "spy"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("a probe created consumer spy: %v", err)
	}
	for _, c := range []string{"probe", "other", manifest.AuditConsumer("alpha").Name} {
		info, err := b.js.Consumer(ctx, "EVENTS", c)
		if err != nil {
			t.Errorf("consumer %s after the probes: %v", c, err)
			continue
		}
		if info.CachedInfo().PauseRemaining > 0 {
			t.Errorf("consumer %s was paused by a probe", c)
		}
	}
}

// bucketProbes are writes and reads of the mesh's buckets.
var bucketProbes = []string{
	"$KV.mesh-registry.module.probe", "$KV.mesh-registry.identity.operator", "$KV.mesh-registry.identity.vault",
	"$KV.mesh-seats.mesh-controller", "$KV.mesh-seats.work", "$KV.mesh-vault.secret.operator.stolen", "$KV.mesh-vault.barrier",
	"$JS.API.DIRECT.GET.KV_mesh-registry", "$JS.API.DIRECT.GET.KV_mesh-registry.$KV.mesh-registry.identity.operator",
	"$JS.API.DIRECT.GET.KV_mesh-seats", "$JS.API.DIRECT.GET.KV_mesh-seats.$KV.mesh-seats.mesh-controller",
	"$JS.API.DIRECT.GET.KV_mesh-vault", "$JS.API.DIRECT.GET.KV_mesh-vault.$KV.mesh-vault.>",
	"$JS.API.STREAM.MSG.GET.KV_mesh-registry", "$JS.API.STREAM.MSG.GET.KV_mesh-seats", "$JS.API.STREAM.MSG.GET.KV_mesh-vault",
}

// TestAdversary_Buckets: no identity but the node's own writes or reads a mesh bucket — not a
// plain module, not a seat's holder, not a join token's bearer.
func TestAdversary_Buckets(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	plainSeed, _ := b.register("module: plain\nrequires: [mesh-bus]\nsecrets: [k]\nemits: [tick]\n")
	holderSeed, _ := b.register("module: holder\nrequires: [mesh-bus]\nseats:\n  work: {scope: mesh, retain: 1h, accepts: [do]}\n")
	hc := b.client(holderSeed)
	if err := hc.Accept("do", func(context.Context, sdk.Job) error { return nil }); err != nil {
		t.Fatal(err)
	}
	holder(t, "work", hc)

	var tok api.Token
	if _, err := b.vault(api.VaultVerbToken, api.VaultRequest{TTL: "1h"}, &tok); err != nil {
		t.Fatal(err)
	}
	bearer, err := vault.ParseToken(tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	tkp, _ := nkeys.FromSeed([]byte(bearer.Seed))
	tpub, _ := tkp.PublicKey()
	quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
	tnc, err := nats.Connect(b.n.ClientURL(), nats.Nkey(tpub, tkp.Sign), nats.MaxReconnects(0), quiet,
		nats.CustomInboxPrefix(api.BootstrapInbox(tpub)))
	if err != nil {
		t.Fatalf("a live token is refused at connect: %v", err)
	}
	t.Cleanup(tnc.Close)

	for _, who := range []struct {
		name string
		nc   *nats.Conn
	}{
		{"plain module", b.raw(plainSeed, "plain")},
		{"seat holder", hc.Conn()},
		{"join token", tnc},
	} {
		t.Run(who.name, func(t *testing.T) {
			for _, subj := range bucketProbes {
				if strings.HasSuffix(subj, ">") {
					continue // not a publish subject
				}
				if !refusedPub(t, who.nc, subj) {
					t.Errorf("%s published on %s", who.name, subj)
				}
			}
			for _, subj := range []string{"$KV.mesh-registry.>", "$KV.mesh-seats.>", "$KV.mesh-vault.>", "$KV.>"} {
				if !refusedSub(t, who.nc, subj, "") {
					t.Errorf("%s subscribed on %s", who.name, subj)
				}
			}
			// Through a KV client the refusal is a permissions violation too.
			js, _ := jetstream.New(who.nc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if kv, err := js.KeyValue(ctx, "mesh-vault"); err == nil {
				if _, err := kv.Put(ctx, "stolen", []byte("x")); err == nil {
					t.Errorf("%s put into mesh-vault", who.name)
				}
			}
		})
	}
	// The holder still holds, and none of the probes' bodies reached a bucket.
	if ok, _ := hc.Holding("work"); !ok {
		t.Error("the holder lost its seat to the probes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, subj := range bucketProbes {
		if !strings.HasPrefix(subj, "$KV.") {
			continue
		}
		stream := "KV_" + strings.Split(subj, ".")[1]
		s, err := b.js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := s.GetLastMsgForSubject(ctx, subj); err == nil && string(m.Data) == "probe" {
			t.Errorf("a probe's body is in %s at %s", stream, subj)
		}
	}
	if _, err := b.vault(api.VaultVerbList, api.VaultRequest{Owner: "plain"}, nil); err != nil {
		t.Fatalf("vault after the probes: %v", err)
	}
}

// TestAdversary_OtherInboxes: a module cannot listen on another module's inbox (by name or by
// key) or on the inbox space as a whole, and cannot make the node answer into one.
func TestAdversary_OtherInboxes(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	_, victim := b.register("module: victim\nrequires: [mesh-bus]\nsecrets: [k]\n")
	seed, attacker := b.register("module: attacker\nrequires: [mesh-bus]\nsecrets: [token]\nseats:\n  own: {scope: node, retain: 1d, accepts: [work]}\n")
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "attacker", Name: "token"}, nil); err != nil {
		t.Fatal(err)
	}
	nc := b.raw(seed, "attacker")
	for _, subj := range []string{
		"_INBOX.victim.>", "_INBOX.victim.*", "_INBOX.victim.x", "_INBOX.>", "_INBOX.*.>", "_INBOX.*.*", "_INBOX.*",
		">", "*.>", "_INBOX." + victim.PublicKey + ".>", "_INBOX." + victim.PublicKey + ".x",
	} {
		if !refusedSub(t, nc, subj, "") {
			t.Errorf("attacker subscribed on %s", subj)
		}
		if !refusedSub(t, nc, subj, "attacker") {
			t.Errorf("attacker subscribed on %s in a queue group", subj)
		}
	}
	if refusedSub(t, nc, manifest.InboxPrefix("attacker")+".>", "") {
		t.Fatal("attacker may not listen on its own inbox")
	}

	victimInboxes := []string{manifest.InboxPrefix("victim") + ".x", api.BootstrapInbox(victim.PublicKey) + ".x"}
	s := newSpy(t, b, []string{manifest.InboxPrefix("victim") + ".>", api.BootstrapInbox(victim.PublicKey) + ".>"})
	t.Run("whoami", func(t *testing.T) {
		body, _ := json.Marshal(api.WhoamiRequest{PublicKey: attacker.PublicKey})
		m := sendThenAsk(t, nc, api.WhoamiSubject(attacker.PublicKey), victimInboxes, body)
		var who api.WhoamiReply
		if err := json.Unmarshal(m.Data, &who); err != nil || who.Module != "attacker" {
			t.Fatalf("whoami on the attacker's own inbox: %s, %v", m.Data, err)
		}
		s.none(t, "whoami into another module's inbox")
	})
	t.Run("vault fetch", func(t *testing.T) {
		xkp, _ := nkeys.CreateCurveKeys()
		xpub, _ := xkp.PublicKey()
		body, _ := json.Marshal(api.VaultRequest{XKey: xpub, Name: "token"})
		m := sendThenAsk(t, nc, api.VaultToolSubject(api.VaultVerbFetch, api.VaultModuleCaller("attacker")), victimInboxes, body)
		var r api.VaultReply
		if err := json.Unmarshal(m.Data, &r); err != nil || r.Error != "" || len(r.Sealed) == 0 {
			t.Fatalf("a fetch on the attacker's own inbox: %s, %v", m.Data, err)
		}
		s.none(t, "vault fetch into another module's inbox")
	})
	t.Run("seat tool", func(t *testing.T) {
		body, _ := json.Marshal(api.SeatRequest{Action: "nothing", Seat: "own", Instance: "x"})
		sendThenAsk(t, nc, node.SeatToolSubject("alpha", "attacker"), victimInboxes, body)
		s.none(t, "seat tool into another module's inbox")
	})
}

// jsStreamHeaderExceedsMaximumErr is nats-server's JSStreamHeaderExceedsMaximumErr: a
// message's headers are over 64 KiB.
const jsStreamHeaderExceedsMaximumErr jetstream.ErrorCode = 10097

// bombs are events a module may publish on its own subject with headers and bodies no sdk
// would write; each is signed by the emitter, with its own values first, so the audit log
// must record it as genuine.
func bombs(t *testing.T, sk envelope.Signer, subject string) map[string]*nats.Msg {
	t.Helper()
	stamp := func(body []byte) nats.Header {
		h, err := envelope.Stamp(sk, "bomber", "alpha", subject, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	out := map[string]*nats.Msg{}
	body := []byte(`{"n":1}`)

	h := stamp(body)
	for i := range 1000 {
		h.Set(fmt.Sprintf("x-bomb-%04d", i), strings.Repeat("v", 16))
	}
	out["1,000 headers"] = &nats.Msg{Subject: subject, Header: h, Data: body}

	h = stamp(body)
	h.Set("x-large", strings.Repeat("h", 60<<10))
	out["one 60 KiB header"] = &nats.Msg{Subject: subject, Header: h, Data: body}

	h = stamp(body)
	h.Add(envelope.EventID, "0190a5c2-0000-7000-8000-000000000000")
	h.Add(envelope.Source, "victim")
	h.Add(envelope.Time, "not a time")
	h.Add(envelope.Signature, "forged")
	out["duplicate envelope headers"] = &nats.Msg{Subject: subject, Header: h, Data: body}

	h = stamp(body)
	h.Set("x-utf8", "\xff\xfe\xc3\x28 bad \x00 nul")
	h.Set(envelope.Causation, "\xed\xa0\x80")
	h.Set("x-newline", "a\nx-source: victim\r\n\r\nbody")
	out["invalid UTF-8 and newlines"] = &nats.Msg{Subject: subject, Header: h, Data: body}

	big := []byte(`{"x":"` + strings.Repeat("a", 900<<10) + `"}`)
	out["a 900 KiB body"] = &nats.Msg{Subject: subject, Header: stamp(big), Data: big}

	notJSON := []byte("\x00\x01 not json {{{\xff")
	out["a body that is not JSON"] = &nats.Msg{Subject: subject, Header: stamp(notJSON), Data: notJSON}
	return out
}

// TestAdversary_HeaderBombs: events with 1,000 headers, a 900 KiB header (refused by
// JetStream), conflicting duplicates of the envelope's headers, invalid UTF-8 and newlines, a
// 900 KiB body and a body that is not JSON leave the node healthy: /readyz stays 200, a consumer's handler sees well-formed
// events (or none), and the audit log records them and every later good event, its chain
// intact.
func TestAdversary_HeaderBombs(t *testing.T) {
	t.Parallel()
	b, bomberSeed, goodSeed, got := bombBed(t)

	subject := manifest.EventSubject("bomber", "tick")
	js, _ := jetstream.New(b.raw(bomberSeed, "bomber"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sent := map[string]string{} // event id → bomb
	for name, m := range bombs(t, mustSigner(t, bomberSeed), subject) {
		m.Subject = manifest.AdmitSubject("bomber", m.Subject)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		sent[m.Header.Get(envelope.EventID)] = name
	}
	// A header block over 64 KiB — one header of 900 KiB — is refused by JetStream itself.
	huge, _ := envelope.Stamp(mustSigner(t, bomberSeed), "bomber", "alpha", subject, []byte("{}"), envelope.Options{})
	huge.Set("x-huge", strings.Repeat("h", 900<<10))
	var apiErr *jetstream.APIError
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("bomber", subject), Header: huge, Data: []byte("{}")}); !errors.As(err, &apiErr) || apiErr.ErrorCode != jsStreamHeaderExceedsMaximumErr {
		t.Fatalf("one 900 KiB header: %v, want JetStream's refusal %d", err, jsStreamHeaderExceedsMaximumErr)
	}
	goodID, err := b.client(goodSeed).Emit(ctx, "tick", map[string]int{"after": 1})
	if err != nil {
		t.Fatal(err)
	}

	if code, body := httpGet(t, b.n.HTTPURL()+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz=%d %s after the bombs", code, body)
	}
	// The consumer gets every bomb as a well-formed event, and the good one after them.
	retryUntil(t, 20*time.Second, func() error {
		if n := got.count(); n < len(sent)+1 {
			return fmt.Errorf("sink has %d of %d events", n, len(sent)+1)
		}
		return nil
	})
	for _, e := range got.all() {
		if e.ID == goodID {
			continue
		}
		name, ok := sent[e.ID]
		if !ok || e.Source != "bomber" || e.Key != "bomber.tick" || e.Time.IsZero() {
			t.Errorf("sink got an ill-formed event: id %q (%s) source %q key %q time %v", e.ID, name, e.Source, e.Key, e.Time)
		}
	}

	b.waitAudited(30 * time.Second)
	if recs := b.auditAll("good"); len(recs) != 1 || recs[0].EventID != goodID || !recs[0].Signed {
		t.Fatalf("the good event after the bombs: %+v", recs)
	}
	for id, name := range sent {
		recs := b.audit(api.AuditRequest{Op: "query", Filter: api.AuditFilter{ID: id}}).Records
		if len(recs) != 1 || !recs[0].Signed || !recs[0].SourceMatches {
			t.Errorf("%s: audit records %+v", name, recs)
		}
	}
	// The bomber's records page like any others: the 900 KiB body is left out of the answer,
	// not the record out of the page (the answer used to be refused, for everyone's query).
	if recs := b.auditAll("bomber"); len(recs) != len(sent) {
		t.Errorf("the bomber's records read back: %d, want %d", len(recs), len(sent))
	}
	if v := b.audit(api.AuditRequest{Op: "verify"}).Verification; !v.OK() {
		t.Fatalf("verify after the bombs: broken %+v flagged %+v", v.Broken, v.Flagged)
	}

	// Duplicates whose first values speak for another module: the audit log keeps the event
	// and flags it, and the chain holds.
	forged, _ := envelope.Stamp(mustSigner(t, bomberSeed), "good", "alpha", subject, []byte("{}"), envelope.Options{})
	forged.Add(envelope.Source, "bomber")
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("bomber", subject), Header: forged, Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	b.waitAudited(30 * time.Second)
	recs := b.audit(api.AuditRequest{Op: "query", Filter: api.AuditFilter{ID: forged.Get(envelope.EventID)}}).Records
	if len(recs) != 1 || recs[0].Signed && recs[0].SourceMatches {
		t.Fatalf("an event claiming x-source good on bomber's subject is recorded as genuine: %+v", recs)
	}
	v := b.audit(api.AuditRequest{Op: "verify"}).Verification
	if v.Broken != nil || len(v.Flagged) == 0 || v.Flagged[0].N != recs[0].N {
		t.Fatalf("verify after the forgery: broken %+v flagged %+v, want record %d flagged", v.Broken, v.Flagged, recs[0].N)
	}
}

// TestAdversary_MalformedHeaderBlock: a client in another language writes the header block
// itself, with a bare newline that makes a line without a colon (nats.go's own writer would
// have replaced it). The consumer's handler never sees it as an event; the audit log records
// it, flagged, with its chain intact, and goes on recording.
func TestAdversary_MalformedHeaderBlock(t *testing.T) {
	t.Parallel()
	b, bomberSeed, goodSeed, got := bombBed(t)

	subject := manifest.EventSubject("bomber", "tick")
	body := []byte(`{"n":1}`)
	rawPublish(t, b.n.ClientURL(), mustKey(t, bomberSeed), manifest.AdmitSubject("bomber", subject), malformedHeaderBlock(t, bomberSeed, subject, body), body)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	goodID, err := b.client(goodSeed).Emit(ctx, "tick", map[string]int{"after": 1})
	if err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		for _, e := range got.all() {
			if e.ID == goodID {
				return nil
			}
		}
		return errors.New("the good event after the malformed one is not delivered")
	})
	for _, e := range got.all() {
		if e.ID == "" || e.Source == "" || e.Time.IsZero() {
			t.Errorf("the handler got an ill-formed event: %+v", e)
		}
	}
	// The sdk gives the malformed event up at once: nothing stays pending.
	consumerIdle(t, b, manifest.EventsStreamName, "sink")
	if code, body := httpGet(t, b.n.HTTPURL()+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz=%d %s", code, body)
	}
	b.waitAudited(30 * time.Second)
	if recs := b.auditAll("good"); len(recs) != 1 || recs[0].EventID != goodID {
		t.Fatalf("the good event after the malformed one: %+v", recs)
	}
	v := b.audit(api.AuditRequest{Op: "verify"}).Verification
	if v.Broken != nil {
		t.Fatalf("verify after a malformed header block: broken %+v", v.Broken)
	}
	// The admitter refused it: nats.go decodes no header from such a block, and an event
	// without its envelope is not stored.
	if n, _ := held(t, b, "bomber"); n != 0 {
		t.Fatalf("EVENTS holds %d bytes of bomber's: the malformed event was stored", n)
	}
	t.Logf("the malformed event: flagged %+v; sink saw %d event(s)", v.Flagged, got.count())
}

// rawPublish publishes one message with a header block written by hand, on a connection made
// without nats.go: the nkey handshake, then HPUB.
func rawPublish(t *testing.T, clientURL string, kp nkeys.KeyPair, subject string, hdr, body []byte) {
	t.Helper()
	u, err := url.Parse(clientURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("server greeting %q: %v", line, err)
	}
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(line[5:])), &info); err != nil || info.Nonce == "" {
		t.Fatalf("INFO without a nonce: %q %v", line, err)
	}
	sig, _ := kp.Sign([]byte(info.Nonce))
	pub, _ := kp.PublicKey()
	connect, _ := json.Marshal(map[string]any{"verbose": false, "pedantic": false, "headers": true, "protocol": 1,
		"nkey": pub, "sig": base64.RawURLEncoding.EncodeToString(sig), "lang": "raw", "version": "0"})
	fmt.Fprintf(conn, "CONNECT %s\r\nPING\r\n", connect)
	expectPong := func(what string) {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			switch {
			case strings.HasPrefix(line, "PONG"):
				return
			case strings.HasPrefix(line, "-ERR"):
				t.Fatalf("%s: %s", what, strings.TrimSpace(line))
			}
		}
	}
	expectPong("connect")
	fmt.Fprintf(conn, "HPUB %s %d %d\r\n%s%s\r\nPING\r\n", subject, len(hdr), len(hdr)+len(body), hdr, body)
	expectPong("publish")
}

// TestAdversary_MalformedHeaderBlockIsDeadLettered: an event whose header block nats.go
// cannot decode (a bare newline making a line without a colon, written by a client that is
// not nats.go) is given up by the consumer at once; the node must still write its dead
// letter, with the raw header block, not lose it. A module's admitter refuses such a block
// (TestAdversary_MalformedHeaderBlock), so here it is the operator, who publishes on the
// stream's subjects directly, that stores one.
func TestAdversary_MalformedHeaderBlockIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	bomberSeed, _ := b.register("module: bomber\nrequires: [mesh-bus]\nemits: [tick]\n")
	sinkSeed, _ := b.register("module: sink\nrequires: [mesh-bus]\nconsumes: [bomber.tick]\n")
	sink := b.client(sinkSeed)
	if err := sink.On("bomber.tick", func(context.Context, sdk.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	subject := manifest.EventSubject("bomber", "tick")
	body := []byte(`{"n":1}`)
	rawPublish(t, b.n.ClientURL(), mustKey(t, filepath.Join(b.dir, datadir.OperatorSeedFile)), subject, malformedHeaderBlock(t, bomberSeed, subject, body), body)

	consumerIdle(t, b, manifest.EventsStreamName, "sink") // the sdk gave it up
	var got []*jetstream.RawStreamMsg
	retryUntil(t, 20*time.Second, func() error {
		if got = deadLetters(t, b, manifest.DeadSubject(manifest.EventsStreamName, "sink")); len(got) != 1 {
			return fmt.Errorf("the event the sink gave up is not in DEAD (%d letters)", len(got))
		}
		return nil
	})
	raw, err := base64.StdEncoding.DecodeString(got[0].Header.Get(envelope.DeadRawHeaders))
	if err != nil || !strings.Contains(string(raw), "no colon on this line") {
		t.Errorf("the letter's raw header block %q (%v), want the block as sent", raw, err)
	}
	if s := got[0].Header.Get(envelope.DeadSubject); s != subject || string(got[0].Data) != string(body) {
		t.Errorf("letter subject %q body %q, want %q %q", s, got[0].Data, subject, body)
	}
}

// malformedHeaderBlock is a signed envelope's header block with one line nats.go cannot
// decode (a bare newline leaves "no colon on this line"): what a client that is not nats.go
// can store.
func malformedHeaderBlock(t *testing.T, seedFile, subject string, body []byte) []byte {
	t.Helper()
	h, _ := envelope.Stamp(mustSigner(t, seedFile), "bomber", "alpha", subject, body, envelope.Options{})
	var block strings.Builder
	block.WriteString("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			block.WriteString(k + ": " + v + "\r\n")
		}
	}
	block.WriteString("x-evil: a\nno colon on this line\r\n\r\n")
	return []byte(block.String())
}

// bombBed is a node with a module that sends bombs (bomber), one that emits good events
// (good), and a consumer of both (sink) whose handler collects what it is given.
func bombBed(t *testing.T) (b *bed, bomberSeed, goodSeed string, got *collector) {
	t.Helper()
	b = newBed(t)
	bomberSeed, _ = b.register("module: bomber\nrequires: [mesh-bus]\nemits: [tick]\n")
	goodSeed, _ = b.register("module: good\nrequires: [mesh-bus]\nemits: [tick]\n")
	sinkSeed, _ := b.register("module: sink\nrequires: [mesh-bus]\nconsumes: [bomber.tick, good.tick]\n")
	got = &collector{}
	sink := b.client(sinkSeed, sdk.WithRetryBackoff(10*time.Millisecond))
	for _, p := range []string{"bomber.tick", "good.tick"} {
		if err := sink.On(p, got.handle); err != nil {
			t.Fatal(err)
		}
	}
	return b, bomberSeed, goodSeed, got
}
