package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
)

// Bounds of a module's page.
const (
	moduleEvents  = 20      // the newest events of the module a page shows
	moduleLogTail = 8 << 10 // bytes of a module's output a page shows
	moduleBuilds  = 20      // the newest builds of the module a page shows
)

// ModulePage answers GET /ui/api/modules/{name}: everything the console shows on a module's
// page, each part as the node sees it now. A part that could not be read is named in Errors
// and the rest still shows.
type ModulePage struct {
	Module     string    `json:"module"`
	PublicKey  string    `json:"public_key"`
	Registered time.Time `json:"registered"`
	Updated    time.Time `json:"updated"`
	Manifest   string    `json:"manifest"` // its YAML as registered
	// Permissions are what every connection of the module may do on the bus, derived from
	// its manifest (a seat's holder gets that seat's on top while it holds it).
	Permissions manifest.Permissions `json:"permissions"`
	Seats       []api.SeatStatus     `json:"seats"` // the seats it declares, and who holds them
	Talks       []Edge               `json:"talks"` // who it talks to, and who to it
	Consumers   []StreamConsumer     `json:"consumers"`
	Processes   []api.Process        `json:"processes"`
	Events      []AuditRecord        `json:"events"` // the newest it emitted, as this node's audit log has them
	Logs        ModuleLogs           `json:"logs"`
	Provisions  []api.Provision      `json:"provisions"`
	Quota       *api.QuotaUse        `json:"quota,omitempty"`
	Builds      []api.Build          `json:"builds"`
	Errors      []string             `json:"errors,omitempty"`
}

// StreamConsumer is one of a module's durable consumers and its lag.
type StreamConsumer struct {
	Stream string `json:"stream"`
	Consumer
}

// ModuleLogs is the end of a module's output on this node; Hint says where to read it when
// the module runs only elsewhere (a node's output is its own: `meshnode logs --node`).
type ModuleLogs struct {
	Node string `json:"node,omitempty"`
	Text string `json:"text,omitempty"`
	Hint string `json:"hint,omitempty"`
}

// modulePage serves a module's page.
func (d *Dashboard) modulePage(w http.ResponseWriter, r *http.Request, _ *session) {
	name := r.PathValue("name")
	e, ok := d.cfg.Registry.Get(name)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no module %q is registered (`meshnode module ls` lists them)", name)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), stateTimeout)
	defer cancel()
	p := ModulePage{Module: e.Module, PublicKey: e.PublicKey, Registered: e.Registered, Updated: e.Updated, Manifest: e.Record.Manifest,
		Seats: []api.SeatStatus{}, Talks: []Edge{}, Consumers: []StreamConsumer{}, Processes: []api.Process{}, Events: []AuditRecord{},
		Provisions: []api.Provision{}, Builds: []api.Build{}}
	failed := func(part string, err error) { p.Errors = append(p.Errors, part+": "+err.Error()) }
	if e.Derivation != nil {
		p.Permissions = e.Derivation.Grant(e.PublicKey)
	}
	for _, edge := range d.graph().edges {
		if edge.From == name || edge.To == name {
			p.Talks = append(p.Talks, edge)
		}
	}
	consumers, err := d.currentConsumers()
	if err != nil {
		failed("consumers", err)
	}
	own := ownConsumers(e.Derivation)
	for stream, cs := range consumers {
		for _, c := range cs {
			if own(stream, c.Name) {
				p.Consumers = append(p.Consumers, StreamConsumer{Stream: stream, Consumer: c})
			}
		}
	}
	slices.SortFunc(p.Consumers, func(a, b StreamConsumer) int { return strings.Compare(a.Stream+"/"+a.Name, b.Stream+"/"+b.Name) })
	for _, s := range d.cfg.Mesh.Seats(func(string) (uint64, bool) { return 0, false }) {
		if s.Module == name {
			p.Seats = append(p.Seats, s)
		}
	}
	if ps, err := d.currentProcesses(ctx); err != nil {
		failed("processes", err)
	} else {
		for _, proc := range ps {
			if proc.Module == name {
				p.Processes = append(p.Processes, proc)
			}
		}
	}
	if recs, err := d.cfg.Audit.Query(api.AuditFilter{Source: name, Last: moduleEvents}); err != nil {
		failed("events", err)
	} else {
		for _, rec := range slices.Backward(recs) {
			p.Events = append(p.Events, auditRecordOf(rec))
		}
	}
	p.Logs = d.moduleLogs(name, p.Processes)
	if ps, err := admin.Provisions(ctx, d.cfg.Conn); err != nil {
		failed("provisions", err)
	} else {
		for _, pr := range ps {
			if pr.Consumer == name {
				p.Provisions = append(p.Provisions, pr)
			}
		}
	}
	if d.cfg.Quotas != nil {
		for _, q := range d.cfg.Quotas() {
			if q.Module == name {
				p.Quota = &q
			}
		}
	}
	if bs, err := admin.Builds(ctx, d.cfg.Conn); err != nil {
		failed("builds", err)
	} else {
		for _, b := range bs {
			if b.Module == name {
				p.Builds = append(p.Builds, b)
			}
		}
		slices.SortFunc(p.Builds, func(a, b api.Build) int { return b.Started.Compare(a.Started) })
		p.Builds = p.Builds[:min(len(p.Builds), moduleBuilds)]
	}
	writeJSON(w, http.StatusOK, p)
}

// ownConsumers says which durable consumers are the module's: its consumer on EVENTS, and
// the consumers of the seats it declares (one per node for a node-scoped seat).
func ownConsumers(der *manifest.Derivation) func(stream, consumer string) bool {
	if der == nil {
		return func(string, string) bool { return false }
	}
	return func(stream, consumer string) bool {
		if c := der.EventsConsumer; c != nil && stream == c.Stream && consumer == c.Name {
			return true
		}
		for _, s := range der.Seats {
			if stream == manifest.SeatStreamName(s.Name) && strings.HasPrefix(consumer, "seat-"+s.Name) {
				return true
			}
		}
		return false
	}
}

// moduleLogs is the end of the module's output on this node, if it runs here.
func (d *Dashboard) moduleLogs(module string, procs []api.Process) ModuleLogs {
	var elsewhere []string
	here := false
	for _, p := range procs {
		if p.Node == d.cfg.Node {
			here = true
		} else if !slices.Contains(elsewhere, p.Node) {
			elsewhere = append(elsewhere, p.Node)
		}
	}
	switch {
	case here && d.cfg.Logs != nil:
		reply, err := d.cfg.Logs(api.LogsRequest{Module: module, Offset: -moduleLogTail})
		if err != nil {
			return ModuleLogs{Node: d.cfg.Node, Hint: "its output could not be read: " + err.Error()}
		}
		return ModuleLogs{Node: d.cfg.Node, Text: string(reply.Data)}
	case len(elsewhere) > 0:
		return ModuleLogs{Hint: fmt.Sprintf("it runs on %s; its output: `meshnode logs %s --node %s`, or this page on that node", strings.Join(elsewhere, ", "), module, elsewhere[0])}
	default:
		return ModuleLogs{Hint: "it is deployed nowhere: a process of its own connects with its seed"}
	}
}

// currentConsumers returns every stream's durable consumers as last read, read again when
// that was consumersEvery ago.
func (d *Dashboard) currentConsumers() (map[string][]Consumer, error) {
	if !d.consumersDue() {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.consumers, nil
	}
	streams, err := d.cfg.Mesh.Streams(true)
	if err != nil {
		return nil, err
	}
	byStream := map[string][]Consumer{}
	for _, s := range streams {
		byStream[s.Name] = consumersOf(s.Consumers)
	}
	d.keepConsumers(byStream)
	return byStream, nil
}

// currentProcesses returns ps as last read, asked again when that was processesEvery ago.
func (d *Dashboard) currentProcesses(ctx context.Context) ([]api.Process, error) {
	if ps, ok := d.cachedProcesses(); ok {
		return ps, nil
	}
	ps, err := admin.Ps(ctx, d.cfg.Conn)
	if err != nil {
		return nil, err
	}
	d.keepProcesses(ps)
	return ps, nil
}
