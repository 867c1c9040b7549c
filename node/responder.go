package node

import (
	"context"
	"fmt"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/deadletter"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/provision"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/throttle"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// responder is the node's answering connection and the rate limits it applies.
type responder struct {
	nc *nats.Conn // answers every request but the vault's: may publish only to inboxes
	// vault answers the vault's requests, with the same permissions: one connection has one
	// stream of messages from the server, read in order, so a flood of whoami queued ahead
	// of a fetch on a shared one would hold the fetch up until the node read through it.
	vault *nats.Conn
	gate  *throttle.Gate // rate limits on whoami and the seat tool
	pace  pacing         // bars the modules that keep on flooding (pacing.go)
}

// connectResponders connects the responder's connections.
func (n *Node) connectResponders(key nkeys.KeyPair) (err error) {
	if n.resp.nc, err = n.bus.Connect(key, n.cfg.Name+"-responder"); err != nil {
		return fmt.Errorf("connect responder: %w", err)
	}
	n.closers.PushFunc("responder", n.resp.nc.Close)
	if n.resp.vault, err = n.bus.Connect(key, n.cfg.Name+"-vault-responder"); err != nil {
		return fmt.Errorf("connect the vault's responder: %w", err)
	}
	n.closers.PushFunc("vault's responder", n.resp.vault.Close)
	return nil
}

// The node answers requests — the controller's tools, the vault's, its own seat and cluster
// tools, its audit log — and a request names the subject of its reply. Answered from a
// connection that may publish anywhere, a reply subject is a write to anywhere: a module that
// names `$KV.mesh-vault.x` as its reply makes the node overwrite a vault record. So every
// responder answers from one connection whose only publish permission is the inbox space,
// and the server refuses any other reply subject; writes to buckets and streams go through
// other connections, never chosen by a requester.

// responderInboxes is what the responder connection may publish to: replies, nothing else.
const responderInboxes = "_INBOX.>"

// responderPermissions are the responder connection's: hear the node's tool subjects, answer
// on inboxes.
func responderPermissions(node string) manifest.Permissions {
	return manifest.Permissions{
		Publish: []string{responderInboxes},
		Subscribe: []manifest.Subscription{
			{Subject: manifest.SeatToolSubject(manifest.ControllerSeat, ">")},
			{Subject: manifest.SeatToolSubject(manifest.VaultSeat, ">")},
			{Subject: manifest.SeatToolSubject(build.GitSeat, ">")},     // archive, changed
			{Subject: manifest.SeatToolSubject(build.BuilderSeat, ">")}, // status
			{Subject: manifest.NodeToolSubject(node, ">")},              // the seat, cluster and audit tools
		},
	}
}

// newPartIdentity mints the key of one of the node's parts with a connection of its own (the
// responder, the dead-letter writer) for this start — it never leaves the process — and the
// identity the bus gives it: its permissions, and nothing else.
func newPartIdentity(name string, p manifest.Permissions) (nkeys.KeyPair, string, embedbus.Identity, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, "", embedbus.Identity{}, err
	}
	pub, _ := kp.PublicKey()
	return kp, pub, embedbus.Identity{Name: name, Permissions: &p}, nil
}

// newGate is the node's rate limit per identity on whoami and the seat tool; refusals become
// one node event per identity and tool per interval, with a count.
func (n *Node) newGate() {
	n.resp.gate = throttle.New(float64(n.cfg.RateLimit), 2*n.cfg.RateLimit, 0, func(r throttle.Refusal) {
		// The node's own connection: the cluster's event connection, which a single node has
		// none of, left a single node's refusals unrecorded. The gate's last report is made
		// before the bus closes (closed in reverse order).
		publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, "refused", map[string]any{
			"identity": r.Identity, "tool": r.Reason, "count": r.Count, "last_reason": r.Detail, "until": r.Until,
		}, n.log)
		n.log.Warn("requests refused", "identity", r.Identity, "tool", r.Reason, "count", r.Count, "last_reason", r.Detail)
	})
	n.newPacing()
	n.closers.PushFunc("rate limits", n.resp.gate.Start()) // the last report made
}

// partInbox is the inbox prefix of one of the node's parts with a connection of its own (the
// vault, the dead-letter writer): a leading underscore, which no module name and no key
// has, so no module shares it, and the part hears its own replies and nobody else's.
func partInbox(part, node string) string { return "_INBOX._" + part + "_" + node }

// openDeadLetters connects the dead-letter writer on its own bus identity and opens it.
func (n *Node) openDeadLetters(key nkeys.KeyPair) (*deadletter.Writer, error) {
	nc, err := n.bus.Connect(key, n.cfg.Name+"-dead-letters", nats.CustomInboxPrefix(partInbox("dead", n.id.Name)))
	if err != nil {
		return nil, fmt.Errorf("connect dead-letter writer: %w", err)
	}
	// Its writes outlive Open (whose context ends when it returns): Close ends them.
	d, err := deadletter.OpenWriter(context.Background(), deadletter.WriterConfig{
		Conn: nc, Logger: n.log.With("component", "dead-letters"), Share: n.budget.DeadShare,
		Written: n.metrics.meter.DeadLetters, Evicted: n.metrics.meter.DeadEvicted, Lost: n.metrics.meter.DeadLost,
		Report: func(e deadletter.Eviction) {
			if nc := n.mesh.eventConn.Load(); nc != nil {
				publishNodeEvent(nc, n.key, n.id.Name, "dead-letters-evicted", map[string]any{
					"stream": e.Stream, "consumer": e.Consumer, "letters": e.Letters, "bytes": e.Bytes, "share": e.Share,
				}, n.log)
			}
		}})
	if err != nil {
		return nil, fmt.Errorf("start dead-letter writer: %w", err)
	}
	return d, nil
}

// vaultPermissions are the vault's own connection's on node: its bucket (create, read, watch,
// write), its events, and the replies of its JetStream requests on its own inbox — nothing
// of the registry's, the leases', any module's, or others' replies. Its answers to requests
// go through the responder.
func vaultPermissions(node string) manifest.Permissions {
	kv := "KV_" + vault.Bucket
	return manifest.Permissions{
		Publish: []string{
			"$KV." + vault.Bucket + ".>",
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO." + kv, "$JS.API.STREAM.CREATE." + kv, "$JS.API.STREAM.UPDATE." + kv,
			"$JS.API.STREAM.MSG.GET." + kv, "$JS.API.DIRECT.GET." + kv, "$JS.API.DIRECT.GET." + kv + ".>",
			"$JS.API.CONSUMER.CREATE." + kv, "$JS.API.CONSUMER.CREATE." + kv + ".>",
			"$JS.API.CONSUMER.DELETE." + kv + ".>", "$JS.API.CONSUMER.INFO." + kv + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + kv + ".>", "$JS.FC." + kv + ".>", "$JS.ACK." + kv + ".>",
			api.VaultEventSubject(">"),
		},
		Subscribe: []manifest.Subscription{{Subject: partInbox("vault", node) + ".>"}},
	}
}

// The node's own connection — the registry, the leases, the audit log, the controller's
// streams and consumers, deployments, drift, growth — needs the JetStream API, which is the
// whole store, but nothing of the modules' namespaces and nothing of the other parts': a
// defect that sent a requester's subject through it would still be refused by the server.

// nodeInbox is the node's own connection's inbox prefix: its replies, nobody else's.
func nodeInbox(node string) string { return partInbox("node", node) }

// nodePermissions are the node's own connection's: the JetStream API and what JetStream
// hands back (acks, flow control, snapshots); the mesh's buckets and object stores through
// their subjects; node events and STATE; the tools it calls (the mesh's own seats', the
// vault's as a node, providers' provisioning); the mesh's own seats' events; seats' work
// (its reports and builds, and the dashboard's replay of a job); replays of events; its own
// inbox, and what it listens to (node events, modules' tool statistics for this node,
// providers' answers, JetStream's advisories). Not: a module's events, tools, bucket or
// inbox, other nodes' tools, dead letters (the dead-letter writer's), replies to anyone
// (the responder's).
func nodePermissions(node string) manifest.Permissions {
	pub := []string{
		"$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$JS.SNAPSHOT.>",
		"$KV." + registry.Bucket + ".>", "$KV." + seats.Bucket + ".>", "$KV." + provision.Bucket + ".>",
		"$O." + artifact.Bucket + ".>", "$O." + build.SourcesBucket + ".>",
		manifest.NodeEventSubject(node, ">"), // its own only: it reports on another under its own name
		manifest.StateSubject("*"),           // the controller declares every node
		manifest.SeatToolSubject(manifest.ControllerSeat, ">"),
		api.VaultToolSubject("*", api.VaultCallerNode),
		manifest.SeatToolSubject(build.GitSeat, ">"),     // archive, changed
		manifest.SeatToolSubject(build.BuilderSeat, ">"), // status
		manifest.SeatEventSubject(manifest.ControllerSeat, ">"),
		manifest.SeatEventSubject(build.GitSeat, "pushed"),
		manifest.SeatEventSubject(build.BuilderSeat, "built"), manifest.SeatEventSubject(build.BuilderSeat, "failed"),
		manifest.ReplayEvents, // the dashboard's replay, of what the letter's source could publish
	}
	pub = append(pub, manifest.SeatJobPatterns()...) // work, and versions' work
	for _, tool := range []string{api.ProvisionToolCreate, api.ProvisionToolRemove, api.ProvisionToolHolds} {
		pub = append(pub, manifest.SeatToolSubject("*", tool))
	}
	return manifest.Permissions{
		Publish: pub,
		Subscribe: []manifest.Subscription{
			{Subject: nodeInbox(node) + ".>"},
			{Subject: manifest.NodeEventSubject("*", ">")},
			{Subject: manifest.StatsSubject("*", node)},
			{Subject: manifest.ProvisionInbox + "." + node + ".>"}, // providers' answers to the controller
			{Subject: "$JS.EVENT.ADVISORY.>"},
		},
	}
}

// nodeDeny keeps the node's own connection off the vault's records, which its JetStream API
// and bucket allows would otherwise include: the vault writes them through its own
// connection. The stream as a whole is not denied: growing into a mesh deletes, restores
// and rescales every stream, the vault's too, from this connection.
func nodeDeny() []string {
	kv := "KV_" + vault.Bucket
	return []string{"$KV." + vault.Bucket + ".>", "$JS.API.STREAM.PURGE." + kv, "$JS.API.STREAM.MSG.DELETE." + kv}
}
