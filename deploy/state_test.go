package deploy_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
)

// losing is a JetStream whose next requests are lost, as a clustered stream drops those sent
// while it elects a leader: a lost request is never answered, and its caller waits out its
// context. lostStream Stream lookups and lostPublish publishes are not sent; lostAck
// publishes are stored and their acks lost; noStream publishes find no stream (no leader
// listens yet). inFlight holds the next publish back, its ack lost, and answers the
// following ones as a replicated stream does while a conditional write to the subject is in
// flight (10164), inFlight times, before it stores the one held back.
type losing struct {
	jetstream.JetStream
	lostStream, lostPublish, lostAck, noStream, inFlight atomic.Int32
	held                                                 *nats.Msg
	heldOpts                                             []jetstream.PublishOpt
}

func (l *losing) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if l.lostStream.Add(-1) >= 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.JetStream.Stream(ctx, name)
}

func (l *losing) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	switch {
	case l.held == nil && l.inFlight.Load() > 0:
		l.held, l.heldOpts = m, opts
		<-ctx.Done()
		return nil, ctx.Err()
	case l.held != nil && l.inFlight.Add(-1) >= 0:
		return nil, &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Description: "wrong last sequence"}
	case l.held != nil:
		held, opts := l.held, l.heldOpts
		l.held = nil
		if _, err := l.JetStream.PublishMsg(ctx, held, opts...); err != nil {
			return nil, err
		}
		return l.PublishMsg(ctx, m, opts...)
	case l.noStream.Add(-1) >= 0:
		return nil, jetstream.ErrNoStreamResponse
	case l.lostPublish.Add(-1) >= 0:
		<-ctx.Done()
		return nil, ctx.Err()
	case l.lostAck.Add(-1) >= 0:
		if _, err := l.JetStream.PublishMsg(ctx, m, opts...); err != nil {
			return nil, err
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.JetStream.PublishMsg(ctx, m, opts...)
}

// TestPublisher_AsksAgainWhatIsLost: a declaration whose lookups and publish are lost (STATE
// electing a leader) is published once they are answered, within the caller's time; one
// whose ack is lost after it was stored is found stored, not published twice.
func TestPublisher_AsksAgainWhatIsLost(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: manifest.StateStreamName, Subjects: []string{manifest.StateSubject("*")},
		MaxMsgsPerSubject: 1}); err != nil { // as the mesh makes it: no direct gets
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	key, err := envelope.NewSigningKey(kp)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	l := &losing{JetStream: js}
	p := &deploy.Publisher{JS: l, Key: key, Controller: "alpha", Servers: func(name string) (string, bool) { return pub, name == "alpha" }}
	modules := []deploy.Module{{Module: "billing", Version: "1.0.0", Digest: digest, Instances: 1, PublicKey: userKey(t)}}

	for _, tc := range []struct {
		name                                                 string
		lostStream, lostPublish, lostAck, noStream, inFlight int32
		version                                              string
	}{
		{"lookups and a publish lost", 3, 2, 0, 0, 0, "1.0.0"},
		{"an ack lost", 0, 0, 1, 0, 0, "1.0.1"},
		{"no stream to store it", 0, 0, 0, 2, 0, "1.0.2"},
		// More refusals than Publish takes from other writers: one write in flight is waited
		// for, not counted against them.
		{"a write in flight", 0, 0, 0, 0, 7, "1.0.3"},
	} {
		l.lostStream.Store(tc.lostStream)
		l.lostPublish.Store(tc.lostPublish)
		l.lostAck.Store(tc.lostAck)
		l.noStream.Store(tc.noStream)
		l.inFlight.Store(tc.inFlight)
		modules[0].Version = tc.version
		// Within 10 s: a request waited out once takes all of them.
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		d, changed, err := p.Publish(pctx, "beta", 1, modules, deploy.Applied{})
		pcancel()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if l.lostStream.Load() >= 0 || l.lostPublish.Load() >= 0 || l.lostAck.Load() >= 0 || l.noStream.Load() >= 0 || l.inFlight.Load() > 0 || l.held != nil {
			t.Errorf("%s: not every lost request was asked again", tc.name)
		}
		stored, seq, ok, err := deploy.Last(ctx, js, "beta", p.Servers)
		if err != nil || !ok {
			t.Fatalf("%s: the stored declaration: %v (ok %v)", tc.name, err, ok)
		}
		if stored.Revision != d.Revision || stored.Modules[0].Version != tc.version || !changed {
			t.Errorf("%s: STATE holds revision %d of %s, Publish returned revision %d (changed %v)",
				tc.name, stored.Revision, stored.Modules[0].Version, d.Revision, changed)
		}
		info, err := js.Stream(ctx, manifest.StateStreamName)
		if err != nil {
			t.Fatal(err)
		}
		if info.CachedInfo().State.LastSeq != seq {
			t.Errorf("%s: STATE's last sequence is %d, the declaration's %d: published twice", tc.name, info.CachedInfo().State.LastSeq, seq)
		}
	}
}
