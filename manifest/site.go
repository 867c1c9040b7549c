package manifest

// Sites (issue 42): a node that joins as a site links to the hub over a leafnode connection
// it opens itself, and runs its own JetStream in a domain of its own. These are the names and
// the link's permissions both sides derive; docs/sites.md tells the whole path.

// HubDomain is the hub's JetStream domain once it serves sites: a site reaches the hub's
// JetStream as $JS.hub.API (its registry mirror's consumer).
const HubDomain = "hub"

// SiteDomain is site's JetStream domain: the hub reaches the site's JetStream as
// $JS.site-<site>.API (the source of its events).
func SiteDomain(site string) string { return "site-" + site }

// SiteEventsStreamName is the stream on a site that stores its modules' events, so the site
// acks them while its link is down; the hub's EVENTS sources it.
const SiteEventsStreamName = "SITE_EVENTS"

// SiteSourceConsumer is the durable consumer on a site's SITE_EVENTS through which the hub's
// EVENTS sources it, pushing to SiteDeliverSubject(site) across the link: a durable source
// resumes as soon as the link is back (nats-server's probe of the deliver subject), where an
// ephemeral one is made again only after a back-off that grows with each failure while the
// link is down (46 s after a 16 s cut, measured once).
const SiteSourceConsumer = "hub"

// SiteDeliverSubject is where site's SiteSourceConsumer pushes its events to the hub: a
// subject under $JS.S, which the link lets out of the site (SiteLink).
func SiteDeliverSubject(site string) string { return "$JS.S.site." + site }

// SiteDenied are the subjects that never cross a site's link as such, either way: every
// event's. A site's events reach the hub only as its EVENTS' source reads them, and a hub's
// never land on the site, so no event is stored twice.
func SiteDenied() []string { return append(EventPatterns(), ReplayEvents) }

// SiteLink is what a site's link may carry, as the hub grants it (from the site's side:
// Publish is what the site may send into the hub, Subscribe what it may receive), for a site
// whose modules may be those named in modules, and that mirrors the hub's streams named in
// mirrors. Each entry is needed (a leaf test drops each in turn and fails):
//   - the hub's sourcing of SITE_EVENTS: its requests come in on the site's API, the
//     replies ($JSC.R) and the deliveries ($JS.S) go out;
//   - each mirror: its consumer's create goes out on the hub's API, the replies and the
//     deliveries ($JS.M) come in;
//   - flow control ($JS.FC) both ways: sources and mirrors are flow-controlled;
//   - a site's module calling a seat's tool: the call goes out (mesh.seat.<seat>.tool.>,
//     and a later version's), the answer comes in to the module's inbox — only modules'
//     inboxes, never the operator's or a server's;
//   - a site's module submitting a seat's job: the site's admitter passes it out to the
//     seat's queue on the hub (mesh.seat.<seat>.accept.>, a node-scoped seat's, and a later
//     version's), the queue's ack comes in to the module's inbox.
func SiteLink(site string, modules []string, mirrors ...string) Permissions {
	p := Permissions{
		Publish: append([]string{"$JS.S.>", "$JSC.R.>", "$JS.FC.>", seatToolAll("*", V1), seatToolAll("*", "*")},
			SeatJobPatterns()...),
		Subscribe: []Subscription{
			{Subject: "$JS." + SiteDomain(site) + ".API.>"}, {Subject: "$JS.FC.>"},
			{Subject: "$JS.M.>"}, {Subject: "$JSC.R.>"},
		},
	}
	for _, m := range mirrors {
		p.Publish = append(p.Publish, "$JS."+HubDomain+".API.CONSUMER.CREATE."+m)
	}
	for _, m := range modules {
		p.Subscribe = append(p.Subscribe, Subscription{Subject: InboxPrefix(m) + ".>"})
	}
	return p
}
