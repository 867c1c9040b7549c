//go:build integration

package node_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// TestIntegration_AuditJudgesASeatEventByItsEpoch: the controller's events name the epoch of
// the lease their node held. A holder's late event — signed before it stopped, read once
// another node holds the seat — stays genuine on every node, judged by the lease it names;
// the same node's event naming the new holder's epoch is flagged. Judged by the holder at the
// time the log reads it, the late event was a forgery.
func TestIntegration_AuditJudgesASeatEventByItsEpoch(t *testing.T) {
	c := newCluster(t)
	held := func(not string) (seats.Lease, error) {
		kv, err := c.js.KeyValue(c.ctx(), seats.Bucket)
		if err != nil {
			return seats.Lease{}, err
		}
		e, err := kv.Get(c.ctx(), seats.Key(manifest.ControllerSeat, manifest.ScopeMesh, ""))
		if err != nil {
			return seats.Lease{}, err
		}
		var l seats.Lease
		if err := json.Unmarshal(e.Value(), &l); err != nil {
			return l, err
		}
		if l.Epoch == 0 {
			l.Epoch = e.Revision()
		}
		if l.Node == "" || l.Node == not {
			return l, fmt.Errorf("mesh-controller is held by %q", l.Node)
		}
		return l, nil
	}
	var first seats.Lease
	retryUntil(t, 30*time.Second, func() (err error) { first, err = held(""); return err })
	holder := -1
	for i, n := range c.nodes {
		if n.Identity().Name == first.Node {
			holder = i
		}
	}
	if holder < 0 {
		t.Fatalf("mesh-controller is held by %s, not a node of the bed", first.Node)
	}
	c.stop(holder)
	key := nodeKey(t, c.cfgs[holder].DataDir)
	var next seats.Lease
	retryUntil(t, 60*time.Second, func() (err error) { next, err = held(first.Node); return err })

	live := (holder + 1) % 3
	op := connect(t, c.nodes[live].ClientURL(), filepath.Join(c.cfgs[0].DataDir, datadir.OperatorSeedFile))
	defer op.Close()
	js, _ := jetstream.New(op)
	subject := manifest.SeatEventSubject(manifest.ControllerSeat, "provisioned")
	publish := func(epoch uint64) string {
		body := []byte(`{"late":true}`)
		h, err := envelope.Stamp(key, manifest.ControllerSeat, first.Node, subject, body, envelope.Options{SeatEpoch: epoch})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(c.ctx(), &nats.Msg{Subject: subject, Header: h, Data: body}); err != nil {
			t.Fatal(err)
		}
		return h.Get(envelope.EventID)
	}
	late, claimed := publish(first.Epoch), publish(next.Epoch)
	for i, n := range c.nodes {
		if i == holder {
			continue
		}
		name := n.Identity().Name
		for id, want := range map[string]string{late: "", claimed: api.AuditFlagBadSignature} {
			retryUntil(t, 30*time.Second, func() error {
				reply, err := audit.Call(c.ctx(), op, name, api.AuditRequest{Op: "query", Filter: api.AuditFilter{ID: id}})
				if err != nil {
					return err
				}
				if len(reply.Records) != 1 {
					return fmt.Errorf("%s's audit log has %d records of %s", name, len(reply.Records), id)
				}
				if got := reply.Records[0].NotGenuine; got != want {
					return fmt.Errorf("on %s, %s's event naming epoch %s is judged %q (%s), want %q (epochs: %s held %d, %s holds %d)",
						name, first.Node, reply.Records[0].Headers[envelope.SeatEpoch], got, reply.Records[0].NotGenuineWhy, want, first.Node, first.Epoch, next.Node, next.Epoch)
				}
				return nil
			})
		}
	}
}

// nodeKey is the node key in the data dir of a stopped node.
func nodeKey(t *testing.T, dir string) nkeys.KeyPair {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, datadir.StoreFile), 0o600, &bolt.Options{Timeout: 5 * time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f, err := genesis.New(db).Foundation()
	if err != nil {
		t.Fatal(err)
	}
	k, err := f.NodeKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}
