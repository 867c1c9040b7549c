package dashboard

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Mesh is what the dashboard reads of the node it runs in, each call as things stand now.
type Mesh interface {
	// Members lists the mesh's servers as the node sees them.
	Members() []Member
	// Streams reads every stream's state, and its consumers' when consumers is set.
	Streams(consumers bool) ([]embedbus.StreamState, error)
	// Seats reports every seat, each with its backlog as backlog reads it from the streams
	// just read; nil while the node serves no seats.
	Seats(backlog func(stream string) (uint64, bool)) []api.SeatStatus
}

// Registry is what the dashboard reads of the mesh's registry: its modules, and the
// operator's key that signs logins.
type Registry interface {
	Revision() uint64
	List() []*registry.Entry
	Get(module string) (*registry.Entry, bool)
	Operator() string
}

// AuditLog is the node's audit log, whose tail a snapshot shows.
type AuditLog interface {
	Changes() uint64
	Query(api.AuditFilter) ([]api.AuditRecord, error)
	// NotGenuine counts the records that are not genuine events, by kind (the banner).
	NotGenuine() map[string]uint64
}

var (
	_ Registry = (*registry.Registry)(nil)
	_ AuditLog = (*audit.Logger)(nil)
)

// Config is what a Dashboard reads and acts through. Every field is required.
type Config struct {
	Node     string // this node's name: the cookie's and the login message's
	MeshID   string
	Mesh     Mesh
	Registry Registry
	Audit    AuditLog
	// Conn is the node's own connection: the controller's ps, deploy and undeploy, and the
	// replay of a dead letter go out on it.
	Conn      *nats.Conn
	JetStream jetstream.JetStream // DEAD's letters, read, replayed and dropped
	// Quotas is each registered module's use of EVENTS against its quota, as the node's
	// admitter sees it; nil: not shown.
	Quotas func() []api.QuotaUse
	// Sessions keeps the console's session key and logouts (BoltSessions, in the node's
	// store): sessions survive the node's restart. Nil keeps them in memory.
	Sessions SessionStore
	// Record, if set, records an action an operator took in the console (the node audits it
	// as its node event console-action): what, on what, the operator's key and the outcome.
	Record func(action ConsoleAction)
	// Logs reads a module's output on this node, as the node's logs tool does; nil: a
	// module's page shows none.
	Logs func(api.LogsRequest) (api.LogsReply, error)
	// Counters reads the node's running totals of events and of errors, which the console
	// charts over the last hour (rates.go: what each counts); nil: no charts.
	Counters func() (events, errors uint64)
	// RateEvery is how often the counters are read (default 10 s; a test's is shorter).
	RateEvery time.Duration
	Log       *slog.Logger
}

// ConsoleAction is an action an operator took in the console, as it is audited.
type ConsoleAction struct {
	Operator string `json:"operator"` // the operator's public key the session was logged in with
	Action   string `json:"action"`   // deploy, undeploy, dead-replay, dead-drop
	Target   string `json:"target"`   // the module, or the dead letter's sequence
	Detail   string `json:"detail,omitempty"`
	Error    string `json:"error,omitempty"` // why it failed; empty when it was done
}

// Meta is the action as its node event's body.
func (a ConsoleAction) Meta() map[string]any {
	m := map[string]any{"operator": a.Operator, "action": a.Action, "target": a.Target}
	if a.Detail != "" {
		m["detail"] = a.Detail
	}
	if a.Error != "" {
		m["error"] = a.Error
	}
	return m
}

// Dashboard serves the operator's console: its pages, the snapshot, the snapshot's stream
// and the operator's actions (Handler).
type Dashboard struct {
	cfg    Config
	ctx    context.Context // ends at Close: the handlers and streams end
	cancel context.CancelFunc
	wg     sync.WaitGroup // the handlers, the snapshot loop and the counters' reader
	rates  *rater         // the charts' counts; nil without Config.Counters

	mu         sync.Mutex
	challenges map[string]time.Time // nonce → expiry
	mods       *moduleGraphAt       // the modules and edges of the registry as last read (graph)
	// audit is the audit tail of the log as it stood at auditAt changes (audit.Changes),
	// read again only when the log changed.
	audit   []AuditRecord
	auditAt uint64
	// consumers are every stream's consumers as read at consumersAt (consumersDue).
	consumers   map[string][]Consumer
	consumersAt time.Time
	// processes are ps as the controller answered at processesAt (every processesEvery).
	processes   []api.Process
	processesAt time.Time
	// dead are the newest dead letters and their total while DEAD stands at deadAt (its
	// messages and last sequence): read again only when it changed.
	dead      []DeadLetter
	deadTotal int
	deadAt    [2]uint64

	// watchMu guards the watchers, and the start of a handler or the snapshot loop against
	// Close: none starts once Close cancelled ctx.
	watchMu  sync.Mutex
	watchers map[chan []byte]struct{}
	last     []byte // the last snapshot sent
	running  bool   // the snapshot loop runs while someone watches
}

// Open returns the dashboard of cfg.Node. Its handlers, event streams and snapshot loop
// end when ctx ends or Close is called; Close waits for them.
func Open(ctx context.Context, cfg Config) *Dashboard {
	if cfg.Sessions == nil {
		cfg.Sessions = &memorySessions{}
	}
	d := &Dashboard{cfg: cfg, challenges: map[string]time.Time{}, watchers: map[chan []byte]struct{}{}}
	d.ctx, d.cancel = context.WithCancel(ctx)
	if cfg.Counters != nil {
		d.rates = &rater{read: cfg.Counters, every: cmp.Or(cfg.RateEvery, defaultRateEvery)}
		d.wg.Add(1)
		go d.rates.run(d)
	}
	return d
}

// Close ends the dashboard's handlers, event streams and snapshot loop and waits for them;
// a request after it is answered 503. It is safe to call more than once, and on nil.
func (d *Dashboard) Close() error {
	if d == nil {
		return nil
	}
	d.watchMu.Lock() // no handler or snapshot loop starts after this
	d.cancel()
	d.watchMu.Unlock()
	d.wg.Wait()
	return nil
}

// Handler serves the dashboard: GET / (a redirect to the pages) and everything under /ui/.
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	d.routes(mux)
	return mux
}

// Watchers is how many dashboard pages' live streams it is serving now (none on nil).
func (d *Dashboard) Watchers() int {
	if d == nil {
		return 0
	}
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	return len(d.watchers)
}
