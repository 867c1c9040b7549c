package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Last returns the declaration last published for node on STATE and its stream sequence;
// ok is false when there is none. A last message that is not a declaration signed by a
// server of the mesh (a forgery, or garbage) comes back as a zero declaration, with its
// sequence: whoever writes next replaces it. Its requests are asked again while STATE settles
// (jsretry.Request), within ctx, or jsretry.Patience when ctx has no deadline.
func Last(ctx context.Context, js jetstream.JetStream, node string, servers ServerKey) (d Declaration, seq uint64, ok bool, err error) {
	d, seq, ok, _, err = lastOf(ctx, js, node, servers)
	return d, seq, ok, err
}

// lastOf is Last, with STATE's last sequence as the lookup of the stream found it: Publish
// composes from both, with one lookup.
func lastOf(ctx context.Context, js jetstream.JetStream, node string, servers ServerKey) (d Declaration, seq uint64, ok bool, streamSeq uint64, err error) {
	ctx, cancel := jsretry.Patient(ctx)
	defer cancel()
	var m *jetstream.RawStreamMsg
	err = jsretry.Request(ctx, func(ctx context.Context) error {
		st, err := js.Stream(ctx, manifest.StateStreamName)
		if err != nil {
			return fmt.Errorf("look up %s: %w", manifest.StateStreamName, err)
		}
		streamSeq = st.CachedInfo().State.LastSeq
		m, err = st.GetLastMsgForSubject(ctx, manifest.StateSubject(node))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			m, err = nil, nil
		}
		if err != nil {
			return fmt.Errorf("read node %s's declaration: %w", node, err)
		}
		return nil
	})
	if err != nil || m == nil {
		return d, 0, false, streamSeq, err
	}
	if d, err = Check(node, m.Subject, m.Header, m.Data, servers, Declaration{}); err != nil {
		d = Declaration{}
	}
	return d, m.Sequence, true, streamSeq, nil
}

// Publisher writes nodes' declarations on STATE for the controller's holder: signed by its
// node, with Nats-Expected-Last-Subject-Sequence so that two controllers (an old holder and
// a new one) cannot interleave their writes for a node.
type Publisher struct {
	JS         jetstream.JetStream
	Key        envelope.Signer
	Controller string    // this node: the declarations' signer
	Servers    ServerKey // the mesh's servers' keys: what published declarations are checked with
}

// maxConflicts bounds how often Publish composes again after another writer got in first.
const maxConflicts = 5

// RepublishAfter is how long after a declaration was composed its node may still report an
// older revision before Publish declares it again: the node refused it for a reason that
// has passed (a lease mirror behind), or it was signed at an epoch the node cannot accept.
const RepublishAfter = 10 * time.Second

// Applied is what a node last reported of its declarations: the revision it applied and
// when it said so (zero: it has not reported to this controller).
type Applied struct {
	Revision uint64
	Reported time.Time
}

// behind reports whether a's node, reporting well after last was composed, still has not
// applied it: it applied an older one, or a newer one than last (STATE was made again, and
// last, at a revision its sequences began again from, was refused).
func (a Applied) behind(last Declaration) bool {
	return a.Revision != last.Revision && a.Reported.After(last.Composed.Add(RepublishAfter))
}

// Publish declares modules for node, unless the declaration published last declares the same
// and the node has not reported itself behind it (then it returns that one and false). The
// revision is one past the last revision for node, STATE's last sequence and the revision
// the node reports applied: a replayed old declaration (which takes a new sequence but keeps
// its revision), or a STATE made again after it was lost (whose sequences begin again),
// never makes the next revision one a node has applied already.
//
// Every request is asked again while STATE settles (jsretry.Request), within ctx, or
// jsretry.Patience when ctx has no deadline: a clustered stream drops a request sent while it
// elects a leader, and one request lost so waited out the whole of its caller's time — a
// `deploy` has 30 s, and in a local CI run one got no answer in them after two of five
// servers were killed. A publish asked again after its first was stored meets the expected
// sequence moved on, and the next turn finds the declaration it stored.
func (p *Publisher) Publish(ctx context.Context, node string, epoch uint64, modules []Module, applied Applied) (Declaration, bool, error) {
	ctx, cancel := jsretry.Patient(ctx)
	defer cancel()
	var (
		mine     []Declaration // those this call composed: an attempt whose answer was lost may have stored one
		refused  = ^uint64(0)  // the sequence the last refused publish expected (none yet)
		inFlight = backoff.Backoff{First: 20 * time.Millisecond, Max: 500 * time.Millisecond}
	)
	for conflicts := 0; conflicts < maxConflicts; {
		last, seq, ok, lastSeq, err := lastOf(ctx, p.JS, node, p.Servers)
		if err != nil {
			return Declaration{}, false, err
		}
		if ok && slices.ContainsFunc(mine, func(d Declaration) bool { return d.Revision == last.Revision && d.Composed.Equal(last.Composed) }) {
			return last, true, nil // stored by an attempt whose ack was lost
		}
		if ok && last.Revision > 0 && SameModules(last.Modules, modules) && !applied.behind(last) {
			return last, false, nil
		}
		// The stream's last sequence is past every revision ever written, forged ones too.
		d := Declaration{Node: node, Revision: max(last.Revision, lastSeq, applied.Revision) + 1, Epoch: epoch,
			Controller: p.Controller, Composed: time.Now().UTC(), Modules: modules}
		body, err := json.Marshal(d)
		if err != nil {
			return Declaration{}, false, err
		}
		h, err := Sign(p.Key, p.Controller, d, body)
		if err != nil {
			return Declaration{}, false, err
		}
		msg := &nats.Msg{Subject: manifest.StateSubject(node), Header: h, Data: body}
		mine = append(mine, d)
		err = jsretry.Request(ctx, func(ctx context.Context) error {
			return jsretry.Stored(p.JS.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(seq)))
		})
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			// Another writer got in first, or a write to the subject is still in flight: a
			// replicated stream refuses a conditional publish while one is (10164), this
			// call's own earlier attempt among them. Compose on top of what was written; while
			// nothing was, wait for the write in flight without counting it as a conflict.
			if seq == refused {
				if inFlight.Wait(ctx) != nil {
					return Declaration{}, false, fmt.Errorf("publish node %s's declaration: a write to it stayed in flight: %w", node, err)
				}
				continue
			}
			refused = seq
			conflicts++
			continue
		}
		if err != nil {
			return Declaration{}, false, fmt.Errorf("publish node %s's declaration: %w", node, err)
		}
		return d, true, nil
	}
	return Declaration{}, false, fmt.Errorf("publish node %s's declaration: another writer got in first %d times; is a second controller holding the seat?", node, maxConflicts)
}
