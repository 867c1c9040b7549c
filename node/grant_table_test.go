package node_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// catalogueGrants is what the running bus must grant each catalogue module's key, written out
// by hand rather than computed: a bed that compared the bus with the function the bus uses
// would stay green with a wrong grant. KEY stands for the module's public key. Publish and
// subscribe are nats-server's allow lists ("subject queue" where a queue is required);
// "_INBOX.operator.>" on publish is how a module answers its tools, and "mesh.mod.<module>.stats.*"
// how it reports their latency (every catalogue module answers calls). A module that does not require
// mesh-bus has no entry: the bus refuses its key.
var catalogueGrants = map[string]struct{ pub, sub []string }{
	"auditor": {
		pub: []string{"mesh.mod.auditor.stats.*", "$JS.ACK.EVENTS.auditor.>", "$JS.API.CONSUMER.INFO.EVENTS.auditor", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.auditor",
			"mesh.seat.mesh-controller.tool.whoami.KEY", "mesh.seat.mesh-vault.tool.fetch.mod.auditor", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.auditor.>", "mesh.mod.auditor.tool.query auditor", "mesh.mod.auditor.tool.status auditor"},
	},
	"billing": {
		pub: []string{"mesh.mod.billing.stats.*", "$JS.ACK.EVENTS.billing.>", "$JS.API.CONSUMER.INFO.EVENTS.billing", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.billing",
			"mesh.admit.billing.mesh.mod.billing.event.invoice.issued", "mesh.admit.billing.mesh.mod.billing.event.order.paid", "mesh.admit.billing.mesh.mod.billing.event.order.placed",
			"mesh.admit.billing.mesh.mod.billing.event.order.refunded", "mesh.admit.billing.mesh.seat.mailer.accept.>", "mesh.admit.billing.mesh.seat.mailer.node.*.accept.>",
			"mesh.seat.mailer.tool.>", "mesh.seat.mesh-controller.tool.whoami.KEY", "mesh.seat.mesh-vault.tool.fetch.mod.billing", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.billing.>", "mesh.mod.billing.tool.invoice billing", "mesh.mod.billing.tool.status billing"},
	},
	"builder": {
		pub: []string{"mesh.mod.builder.stats.*", "mesh.admit.builder.mesh.mod.builder.event.build.failed", "mesh.admit.builder.mesh.mod.builder.event.built", "mesh.node.*.tool.seat.builder",
			"mesh.seat.mesh-controller.tool.whoami.KEY", "mesh.seat.mesh-vault.tool.fetch.mod.builder", "mesh.admit.builder.mesh.seat.registry-index.accept.>",
			"mesh.admit.builder.mesh.seat.registry-index.node.*.accept.>", "mesh.seat.registry-index.tool.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.builder.>"},
	},
	"downloader": {
		pub: []string{"mesh.mod.downloader.stats.*", "mesh.admit.downloader.mesh.mod.downloader.event.download.completed", "mesh.admit.downloader.mesh.mod.downloader.event.download.failed",
			"mesh.admit.downloader.mesh.mod.downloader.event.download.started", "mesh.node.*.tool.seat.downloader", "mesh.seat.mesh-controller.tool.whoami.KEY", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.downloader.>", "mesh.mod.downloader.tool.status downloader"},
	},
	"git": {
		pub: []string{"mesh.mod.git.stats.*", "mesh.admit.git.mesh.mod.git.event.branch.deleted", "mesh.admit.git.mesh.mod.git.event.pushed", "mesh.admit.git.mesh.mod.git.event.tag.created",
			"mesh.node.*.tool.seat.git", "mesh.seat.mesh-controller.tool.whoami.KEY", "mesh.seat.mesh-vault.tool.fetch.mod.git", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.git.>", "mesh.mod.git.tool.refs git", "mesh.mod.git.tool.status git"},
	},
	"mailer": {
		pub: []string{"mesh.mod.mailer.stats.*", "mesh.admit.mailer.mesh.mod.mailer.event.bounce.received", "mesh.node.*.tool.seat.mailer", "mesh.seat.mesh-controller.tool.whoami.KEY",
			"mesh.seat.mesh-vault.tool.fetch.mod.mailer", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.mailer.>", "mesh.mod.mailer.tool.status mailer"},
	},
	"registry": {
		pub: []string{"mesh.mod.registry.stats.*", "mesh.admit.registry.mesh.mod.registry.event.image.deleted", "mesh.admit.registry.mesh.mod.registry.event.image.pushed", "mesh.node.*.tool.seat.registry",
			"mesh.seat.mesh-controller.tool.whoami.KEY", "mesh.seat.mesh-vault.tool.fetch.mod.registry", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.registry.>", "mesh.mod.registry.tool.status registry"},
	},
	"release": {
		pub: []string{"mesh.mod.release.stats.*", "$JS.ACK.EVENTS.release.>", "$JS.API.CONSUMER.INFO.EVENTS.release", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.release",
			"mesh.admit.release.mesh.mod.release.event.rollout.completed", "mesh.admit.release.mesh.mod.release.event.rollout.started", "mesh.admit.release.mesh.seat.build-machine.accept.>",
			"mesh.admit.release.mesh.seat.build-machine.node.*.accept.>", "mesh.seat.build-machine.tool.>", "mesh.seat.mesh-controller.tool.whoami.KEY",
			"mesh.admit.release.mesh.seat.registry-index.accept.>", "mesh.admit.release.mesh.seat.registry-index.node.*.accept.>", "mesh.seat.registry-index.tool.>", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.release.>", "mesh.mod.release.tool.plan release", "mesh.mod.release.tool.status release"},
	},
	"shop": {
		pub: []string{"mesh.mod.shop.stats.*", "$JS.ACK.EVENTS.shop.>", "$JS.API.CONSUMER.INFO.EVENTS.shop", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.shop",
			"mesh.admit.shop.mesh.mod.shop.event.cart.checked-out", "mesh.admit.shop.mesh.mod.shop.event.product.updated", "mesh.admit.shop.mesh.seat.mailer.accept.>",
			"mesh.admit.shop.mesh.seat.mailer.node.*.accept.>", "mesh.seat.mailer.tool.>", "mesh.seat.mesh-controller.tool.whoami.KEY",
			"mesh.seat.mesh-vault.tool.fetch.mod.shop", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.shop.>", "mesh.mod.shop.tool.catalogue shop", "mesh.mod.shop.tool.status shop"},
	},
	"telegram": {
		pub: []string{"mesh.mod.telegram.stats.*", "$JS.ACK.EVENTS.telegram.>", "$JS.API.CONSUMER.INFO.EVENTS.telegram", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.telegram",
			"mesh.admit.telegram.mesh.mod.telegram.event.message.received", "mesh.node.*.tool.seat.telegram", "mesh.admit.telegram.mesh.seat.mailer.accept.>",
			"mesh.admit.telegram.mesh.seat.mailer.node.*.accept.>", "mesh.seat.mailer.tool.>", "mesh.seat.mesh-controller.tool.whoami.KEY",
			"mesh.seat.mesh-vault.tool.fetch.mod.telegram", "_INBOX.operator.>"},
		sub: []string{"_INBOX.KEY.>", "_INBOX.telegram.>", "mesh.mod.telegram.tool.status telegram"},
	},
}

// grantDiff compares what the bus grants with a literal table entry (KEY replaced by the
// module's key); nil when they are the same sets.
func grantDiff(got *server.Permissions, pub, sub []string, key string) error {
	if got == nil || got.Publish == nil || got.Subscribe == nil {
		return fmt.Errorf("the bus grants everything or nothing: %+v", got)
	}
	// The table writes the module's key as KEY. Only the table's side is filled in: a real
	// key may itself contain "KEY" (one in CI did), which must not be rewritten on the bus's.
	norm := func(in []string, placeholder bool) []string {
		out := make([]string, len(in))
		for i, s := range in {
			if placeholder {
				s = strings.ReplaceAll(s, "KEY", key)
			}
			out[i] = s
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	gp, gs := norm(got.Publish.Allow, false), norm(got.Subscribe.Allow, false)
	wp, ws := norm(pub, true), norm(sub, true)
	if !slices.Equal(gp, wp) || !slices.Equal(gs, ws) || got.Response != nil || len(got.Publish.Deny) > 0 {
		return fmt.Errorf("the bus grants\n  publish %v\n  subscribe %v\n  responses %+v\nthe table says\n  publish %v\n  subscribe %v",
			gp, gs, got.Response, wp, ws)
	}
	return nil
}

// TestBed_GrantTableCatchesAnOverGrant is the permission bed's mutation test: a grant added
// through the real path — a registration that declares one event more, and one that holds a
// secret more — must make the table comparison fail. A bed that stays green here proves
// nothing.
func TestBed_GrantTableCatchesAnOverGrant(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	cat := catalogue(t)
	_, reg := b.register(cat["mailer"])
	table := catalogueGrants["mailer"]
	got, _ := b.n.Bus().Grant(reg.PublicKey, "")
	if err := grantDiff(got, table.pub, table.sub, reg.PublicKey); err != nil {
		t.Fatalf("unmutated: %v", err)
	}
	for _, mutation := range []struct{ name, from, to string }{
		{"one more event", "emits: [bounce.received]", "emits: [bounce.received, stolen.thing]"},
		{"one more tool", "tools: [status]", "tools: [status, debug]"},
	} {
		text := strings.Replace(cat["mailer"], mutation.from, mutation.to, 1)
		if text == cat["mailer"] {
			t.Fatalf("%s: the catalogue's mailer no longer reads %q", mutation.name, mutation.from)
		}
		b.register(text)
		got, _ := b.n.Bus().Grant(reg.PublicKey, "")
		if err := grantDiff(got, table.pub, table.sub, reg.PublicKey); err == nil {
			t.Errorf("%s: the bus now grants more, and the table comparison did not notice", mutation.name)
		}
		b.register(cat["mailer"])
	}
}

// TestGrantDiff_KeyContainingKEY: a module key may itself contain "KEY" (about one base32 key
// in six hundred; the catalogue bed registers eleven, and CI met one); the comparison fills
// the placeholder in the table only, so such a key still matches its own grant.
func TestGrantDiff_KeyContainingKEY(t *testing.T) {
	t.Parallel()
	const key = "UCEM2JU3MS5POBRIZOVJTRU23C4FXKIWKZVH633UBBWKDRBW2KEYEEPE"
	got := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"mesh.seat.mesh-controller.tool.whoami." + key}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX." + key + ".>"}},
	}
	if err := grantDiff(got, []string{"mesh.seat.mesh-controller.tool.whoami.KEY"}, []string{"_INBOX.KEY.>"}, key); err != nil {
		t.Fatal(err)
	}
}
