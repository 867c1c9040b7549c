package manifest

import (
	"slices"
	"strings"
	"testing"
)

// TestSiteDenied_EveryEventAndNothingElse: no event subject crosses a site's link as such —
// of a module, a seat in any version, a node, or a replay — and a tool call or a seat's job
// is not denied by it.
func TestSiteDenied_EveryEventAndNothingElse(t *testing.T) {
	denied := func(subject string) bool {
		return slices.ContainsFunc(SiteDenied(), func(p string) bool { return Matches(p, subject) })
	}
	events := []string{
		EventSubject("shop", "order.placed"),
		SeatEventSubject("mailer", "delivered"),
		NodeEventSubject("b", "joined"),
		ReplaySubject("billing", EventSubject("shop", "order.placed")),
	}
	for _, v := range LaterVersions() {
		events = append(events, SeatEventSubjectAt("mailer", v, "delivered"))
	}
	for _, s := range events {
		if !denied(s) {
			t.Errorf("event subject %s would cross a site's link", s)
		}
	}
	for _, s := range []string{ToolSubject("shop", "status"), SeatAcceptSubject("mailer", "send"), "_INBOX.shop.x"} {
		if denied(s) {
			t.Errorf("%s is denied on a site's link, but it is no event", s)
		}
	}
}

// TestSiteLink_MirrorsAndDomains: the link lets a site create consumers only on the hub
// streams it mirrors, and lets the hub in only on the site's own domain.
func TestSiteLink_MirrorsAndDomains(t *testing.T) {
	p := SiteLink("oslo", nil, "KV_mesh-registry")
	var creates []string
	for _, s := range p.Publish {
		if strings.Contains(s, ".API.") {
			creates = append(creates, s)
		}
	}
	if want := []string{"$JS.hub.API.CONSUMER.CREATE.KV_mesh-registry"}; !slices.Equal(creates, want) {
		t.Errorf("the site may call the hub's API on %v, want %v", creates, want)
	}
	var in []string
	for _, s := range p.Subscribe {
		if strings.Contains(s.Subject, ".API.") {
			in = append(in, s.Subject)
		}
	}
	if want := []string{"$JS.site-oslo.API.>"}; !slices.Equal(in, want) {
		t.Errorf("the hub may call the site's API on %v, want %v", in, want)
	}
}

// TestSiteLink_InboxesAreModulesOnly: the answers that come in over a link are those to the
// inboxes of the modules named, and no other: never the operator's, a server's part's, or
// every inbox at once.
func TestSiteLink_InboxesAreModulesOnly(t *testing.T) {
	p := SiteLink("oslo", []string{"shop", "ledger"})
	var inboxes []string
	for _, s := range p.Subscribe {
		if strings.HasPrefix(s.Subject, "_INBOX") {
			inboxes = append(inboxes, s.Subject)
		}
	}
	if want := []string{"_INBOX.shop.>", "_INBOX.ledger.>"}; !slices.Equal(inboxes, want) {
		t.Errorf("the link lets answers in to %v, want %v", inboxes, want)
	}
	for _, s := range []string{SeatToolSubject("desk", "status"), SeatToolSubjectAt("desk", "v2", "status"),
		SeatAcceptSubject("desk", "work"), SeatAcceptSubjectAt("desk", "v2", "work"), SeatNodeAcceptSubject("desk", "a", "work")} {
		if !slices.ContainsFunc(p.Publish, func(pattern string) bool { return Matches(pattern, s) }) {
			t.Errorf("a site's module may not call or submit to %s over the link", s)
		}
	}
}
