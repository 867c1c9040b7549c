package deadletter

import (
	"testing"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// TestReplayable is the rule Replay applies before publishing a letter as the
// operator: only what the letter's source could have published itself.
func TestReplayable(t *testing.T) {
	keys := map[string]nkeys.KeyPair{}
	mods := []api.ModuleInfo{}
	for name, text := range map[string]string{
		"shop":    "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\nuses: [mail]\ntools: [status]\n",
		"billing": "module: billing\nrequires: [mesh-bus]\nemits: [paid]\n",
		"mailer": "module: mailer\nrequires: [mesh-bus]\nseats:\n  mail: {scope: mesh, retain: 1h, accepts: [send], emits: [sent]}\n" +
			"  poll: {scope: node, retain: 1h, accepts: [run]}\n",
	} {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		keys[name] = kp
		mf, err := manifest.Parse([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, api.ModuleInfo{Module: name, PublicKey: pub, Emits: mf.Emits, Uses: mf.Uses, Manifest: text})
	}
	auth := AuthorityOf(mods)
	for _, signer := range []string{"alpha", "mesh-vault"} { // a server's key, the vault's
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		keys[signer] = kp
		if signer == "alpha" {
			auth[nodeSigner(signer)] = replaySource{publicKey: pub}
		} else {
			auth[seatSigner(signer)] = replaySource{publicKey: pub}
		}
	}
	body := []byte(`{"order":7}`)
	// letter is a dead letter of an envelope stamped by signer as source on subject.
	letter := func(subject, source, signer string) nats.Header {
		kp := keys[signer]
		if kp == nil {
			kp, _ = nkeys.CreateUser()
		}
		h, err := envelope.Stamp(kp, source, "alpha", subject, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		h.Set(envelope.DeadSubject, subject)
		h.Set(envelope.DeadReason, "max deliveries")
		return h
	}
	twoSources := letter("mesh.mod.shop.event.order.placed", "shop", "shop")
	twoSources.Add(envelope.Source, "billing")
	twoSubjects := letter("mesh.mod.shop.event.order.placed", "shop", "shop")
	twoSubjects.Add(envelope.DeadSubject, "mesh.mod.billing.event.paid")
	noSubject := letter("mesh.mod.shop.event.order.placed", "shop", "shop")
	noSubject.Del(envelope.DeadSubject)
	// A letter that names one subject while signed for another.
	moved := letter("mesh.mod.shop.event.order.placed", "shop", "shop")
	moved.Set(envelope.DeadSubject, "mesh.mod.billing.event.paid")
	for _, tc := range []struct {
		name string
		h    nats.Header
		body []byte
		ok   bool
	}{
		{"a module's declared event", letter("mesh.mod.shop.event.order.placed", "shop", "shop"), body, true},
		{"the operator's identity in the registry", letter("$KV.mesh-registry.identity.operator", "shop", "shop"), body, false},
		{"deleting EVENTS", letter("$JS.API.STREAM.DELETE.EVENTS", "shop", "shop"), body, false},
		{"a vault record", letter("$KV.mesh-vault.x", "shop", "shop"), body, false},
		{"a tool call", letter("mesh.mod.shop.tool.status", "shop", "shop"), body, false},
		{"another module's event", letter("mesh.mod.billing.event.paid", "shop", "shop"), body, false},
		{"an undeclared event", letter("mesh.mod.shop.event.order.cancelled", "shop", "shop"), body, false},
		{"a wildcard", letter("mesh.mod.shop.event.*", "shop", "shop"), body, false},
		{"a full wildcard", letter("mesh.mod.shop.event.>", "shop", "shop"), body, false},
		{"an unregistered module", letter("mesh.mod.ghost.event.x", "ghost", "ghost"), body, false},
		{"signed by another module", letter("mesh.mod.shop.event.order.placed", "shop", "billing"), body, false},
		{"a body altered after signing", letter("mesh.mod.shop.event.order.placed", "shop", "shop"), []byte(`{"order":8}`), false},
		{"a subject other than the signed one", moved, body, false},
		{"two sources", twoSources, body, false},
		{"two original subjects", twoSubjects, body, false},
		{"no original subject", noSubject, body, false},
		{"node state", letter("mesh.state.node.alpha", "alpha", ""), body, false},
		{"a dead subject", letter("mesh.dead.EVENTS.shop", "shop", "shop"), body, false},
		{"an inbox", letter("_INBOX.shop.x", "shop", "shop"), body, false},
		{"a seat's event by its declarer", letter("mesh.seat.mail.event.sent", "mailer", "mailer"), body, true},
		{"a seat's undeclared event", letter("mesh.seat.mail.event.lost", "mailer", "mailer"), body, false},
		{"a seat's event by a module that only uses it", letter("mesh.seat.mail.event.sent", "shop", "shop"), body, false},
		{"a job to a seat the source uses", letter("mesh.seat.mail.accept.send", "shop", "shop"), body, true},
		{"a job to a seat the source does not use", letter("mesh.seat.mail.accept.send", "billing", "billing"), body, false},
		{"a verb the seat does not take", letter("mesh.seat.mail.accept.burn", "shop", "shop"), body, false},
		{"a node-scoped job to a mesh-scoped seat", letter("mesh.seat.mail.node.alpha.accept.send", "shop", "shop"), body, false},
		{"a node-scoped job by the declarer", letter("mesh.seat.poll.node.alpha.accept.run", "mailer", "mailer"), body, true},
		{"a job signed by another", letter("mesh.seat.mail.accept.send", "shop", "mailer"), body, false},
		{"a node's own event", letter("mesh.node.alpha.event.joined", "alpha", "alpha"), body, true},
		{"a node's own event, signed by another key", letter("mesh.node.alpha.event.joined", "alpha", ""), body, false},
		{"an event of a node the mesh does not know", letter("mesh.node.zeta.event.joined", "zeta", ""), body, false},
		{"another node's event", letter("mesh.node.beta.event.left", "alpha", ""), body, false},
		{"the vault's event", letter("mesh.seat.mesh-vault.event.minted", "mesh-vault", "mesh-vault"), body, true},
		{"the vault's event, signed by another key", letter("mesh.seat.mesh-vault.event.minted", "mesh-vault", ""), body, false},
		{"the controller's event, which has no known signer", letter("mesh.seat.mesh-controller.event.deployed", "mesh-controller", ""), body, false},
		{"the vault's event from a module", letter("mesh.seat.mesh-vault.event.minted", "shop", "shop"), body, false},
		{"the controller's tool", letter("mesh.seat.mesh-controller.tool.register", "mesh-controller", ""), body, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := replayable(tc.h, tc.body, auth)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatalf("%s from %s would be replayed", tc.h.Get(envelope.DeadSubject), tc.h.Get(envelope.Source))
			}
		})
	}
}
