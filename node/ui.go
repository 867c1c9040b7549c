package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/deadletter"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// The dashboard: static pages embedded in the binary (no build step), a JSON snapshot of the
// mesh as this node sees it, the same snapshot pushed over server-sent events while it
// changes, and the operator's actions on dead letters.
//
// Access: `meshnode ui` asks the node for a challenge (GET /ui/challenge), signs it with the
// operator's seed and prints a one-time link (/ui/login?...). The node checks the signature
// against the operator's registered key, spends the challenge and sets a session cookie
// (HttpOnly, SameSite=Strict, 12 h). Nothing secret travels in a stream, and no password
// exists. A read-only session sees; an operator session may also act, with the session's
// CSRF token in a header and an Origin, when the browser sends one, of this very host.

//go:embed ui
var uiFiles embed.FS

// Bounds of the dashboard.
const (
	uiChallengeTTL   = time.Minute
	uiSessionTTL     = 12 * time.Hour
	uiMaxChallenges  = 64               // outstanding challenges; older ones are dropped
	uiTick           = time.Second      // how often the snapshot is made while someone watches
	uiAuditTail      = 50               // audit records in a snapshot
	uiConsumersEvery = 5 * time.Second  // how often a snapshot reads every consumer's lag again
	uiProcessesEvery = 2 * time.Second  // how often a snapshot asks the controller for ps again
	uiActionTimeout  = 30 * time.Second // a deploy or undeploy, as long as the CLI waits
	uiDeadShown      = 100              // dead letters in a snapshot (the newest)
	uiCookie         = "meshnode_ui_"   // the session cookie's name, before the node's (cookies ignore ports)
	uiCSRFHeader     = "X-CSRF-Token"   // an action's header
	uiLoginPrefix    = "meshnode-ui:"   // what the operator's signature covers: prefix, mesh, nonce, mode
	uiModeOperator   = "operator"       // may act
	uiModeReadOnly   = "read-only"      // sees only
	uiStateTimeout   = 5 * time.Second  // one snapshot
)

// uiSession is one logged-in browser.
type uiSession struct {
	mode     string
	csrf     string
	expires  time.Time
	operator string // the operator's key that signed it: a session ends when the key changes
}

// uiState is the dashboard's sessions, challenges and watchers.
type uiState struct {
	mu         sync.Mutex
	challenges map[string]time.Time // nonce → expiry
	sessions   map[string]*uiSession
	mods       encodedModules // the modules and edges of registry revision modsRev
	modsRev    uint64
	// audit is the audit tail of the log as it stood at auditAt changes (audit.Changes),
	// read again only when the log changed.
	audit   []UIAudit
	auditAt uint64
	// consumers are every stream's consumers as read at consumersAt (consumersDue).
	consumers   map[string][]UIConsumer
	consumersAt time.Time
	// processes are ps as the controller answered at processesAt (every uiProcessesEvery).
	processes   []registry.Process
	processesAt time.Time
	// dead are the newest dead letters and their total while DEAD stands at deadAt (its
	// messages and last sequence): read again only when it changed.
	dead      []UIDead
	deadTotal int
	deadAt    [2]uint64

	watchMu  sync.Mutex
	watchers map[chan []byte]struct{}
	last     []byte // the last snapshot sent
	running  bool   // the snapshot loop runs while someone watches
}

func newUIState() *uiState {
	return &uiState{challenges: map[string]time.Time{}, sessions: map[string]*uiSession{}, watchers: map[chan []byte]struct{}{}}
}

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// LoginMessage is what the operator signs to log in a browser: the mesh, the node, the
// node's nonce and the session's mode. A signature for one node logs in to no other.
func LoginMessage(meshID, node, nonce, mode string) []byte {
	return []byte(uiLoginPrefix + meshID + ":" + node + ":" + nonce + ":" + mode)
}

// Challenge is GET /ui/challenge's answer.
type Challenge struct {
	Node   string `json:"node"`
	MeshID string `json:"mesh_id"`
	Nonce  string `json:"nonce"`
}

// LoginLink asks the node at httpURL for a challenge, signs it with key (the operator's) and
// returns the one-time link that logs a browser in; readOnly makes a session that only sees.
// want, when set, is the node the caller means: a challenge from any other (something else
// listening on the address) is refused unsigned.
func LoginLink(ctx context.Context, httpURL string, key nkeys.KeyPair, readOnly bool, want Challenge) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(httpURL, "/")+"/ui/challenge", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("ask %s for a login challenge: %w; is the node running (`meshnode status`)?", httpURL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return "", fmt.Errorf("%s serves no dashboard: the node is still starting (`meshnode status` says why) or older than the dashboard", httpURL)
	case resp.StatusCode != http.StatusOK:
		return "", fmt.Errorf("ask %s for a login challenge: %s: %s", httpURL, resp.Status, strings.TrimSpace(string(body)))
	}
	var ch Challenge
	if err := json.Unmarshal(body, &ch); err != nil || ch.Nonce == "" {
		return "", fmt.Errorf("%s answered no login challenge (%q): is it a meshnode?", httpURL, body)
	}
	if (want.Node != "" && ch.Node != want.Node) || (want.MeshID != "" && ch.MeshID != want.MeshID) {
		return "", fmt.Errorf("%s is node %s of mesh %s, not node %s of mesh %s: nothing signed (another process may hold the node's address)",
			httpURL, ch.Node, ch.MeshID, want.Node, want.MeshID)
	}
	mode := uiModeOperator
	if readOnly {
		mode = uiModeReadOnly
	}
	sig, err := key.Sign(LoginMessage(ch.MeshID, ch.Node, ch.Nonce, mode))
	if err != nil {
		return "", err
	}
	q := url.Values{"nonce": {ch.Nonce}, "mode": {mode}, "sig": {base64.RawURLEncoding.EncodeToString(sig)}}
	return strings.TrimSuffix(httpURL, "/") + "/ui/login?" + q.Encode(), nil
}

// serveUI adds the dashboard's routes to mux.
func (n *Node) serveUI(mux *http.ServeMux) {
	static, _ := fs.Sub(uiFiles, "ui")
	files := http.FileServerFS(static)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusFound) })
	mux.Handle("GET /ui/", http.StripPrefix("/ui/", securityHeaders(files)))
	mux.HandleFunc("GET /ui/challenge", n.uiChallenge)
	mux.HandleFunc("GET /ui/login", n.uiLogin)
	mux.HandleFunc("POST /ui/logout", n.uiSessionOnly(false, func(w http.ResponseWriter, r *http.Request, _ *uiSession) {
		if c, err := r.Cookie(uiCookie + n.id.Name); err == nil {
			n.ui.mu.Lock()
			delete(n.ui.sessions, c.Value)
			n.ui.mu.Unlock()
		}
		http.SetCookie(w, &http.Cookie{Name: uiCookie + n.id.Name, Path: "/ui", MaxAge: -1})
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("GET /ui/api/session", n.uiSessionOnly(false, func(w http.ResponseWriter, _ *http.Request, s *uiSession) {
		writeJSON(w, http.StatusOK, map[string]string{"node": n.id.Name, "mesh_id": n.id.MeshID, "mode": s.mode, "csrf": s.csrf})
	}))
	mux.HandleFunc("GET /ui/api/state", n.uiSessionOnly(false, func(w http.ResponseWriter, r *http.Request, _ *uiSession) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(n.uiSnapshot(r.Context()))
	}))
	mux.HandleFunc("GET /ui/api/events", n.uiSessionOnly(false, n.uiEvents))
	mux.HandleFunc("POST /ui/api/dead/{id}/{action}", n.uiSessionOnly(true, n.uiDeadAction))
	mux.HandleFunc("POST /ui/api/deploy", n.uiSessionOnly(true, n.uiDeploy))
	mux.HandleFunc("POST /ui/api/undeploy", n.uiSessionOnly(true, n.uiUndeploy))
}

// UIDeployRequest is the dashboard's deploy form: what `meshnode deploy` takes.
type UIDeployRequest struct {
	Module    string   `json:"module"`
	Version   string   `json:"version"`
	Nodes     []string `json:"nodes,omitempty"` // none: every node
	Instances int      `json:"instances,omitempty"`
}

// uiDeploy deploys a module's artifact version, as `meshnode deploy` does: the controller
// checks it and answers.
func (n *Node) uiDeploy(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	var req UIDeployRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil || req.Module == "" || req.Version == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `POST /ui/api/deploy {"module", "version", "nodes"?: [...], "instances"?: n}: module and version are required`})
		return
	}
	d := deploy.Deployment{Version: req.Version, Nodes: req.Nodes, All: len(req.Nodes) == 0, Instances: max(req.Instances, 1)}
	if e, ok := n.reg.Get(req.Module); ok && e.Deployment != nil {
		// The form sets where, what and how many; the rest stays as the CLI last set it.
		d.Env, d.Args, d.Auto = e.Deployment.Env, e.Deployment.Args, e.Deployment.Auto
	}
	ctx, cancel := context.WithTimeout(r.Context(), uiActionTimeout)
	defer cancel()
	reply, err := admin.Deploy(ctx, n.bus.Conn(), registry.DeployRequest{Module: req.Module, Deployment: d})
	if err != nil {
		writeJSON(w, uiActionStatus(err), map[string]string{"error": err.Error()})
		return
	}
	n.log.Info("deployed from the dashboard", "module", req.Module, "version", req.Version, "nodes", req.Nodes)
	n.ui.forgetProcesses() // the next snapshot asks for ps again
	writeJSON(w, http.StatusOK, reply)
}

// uiUndeploy stops a module everywhere, as `meshnode undeploy` does.
func (n *Node) uiUndeploy(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	var req registry.UndeployRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil || req.Module == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `POST /ui/api/undeploy {"module", "nodes"?: [...]}: module is required`})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), uiActionTimeout)
	defer cancel()
	reply, err := admin.Undeploy(ctx, n.bus.Conn(), req)
	if err != nil {
		writeJSON(w, uiActionStatus(err), map[string]string{"error": err.Error()})
		return
	}
	n.log.Info("undeployed from the dashboard", "module", req.Module, "nodes", req.Nodes)
	n.ui.forgetProcesses()
	writeJSON(w, http.StatusOK, reply)
}

// uiActionStatus is the HTTP status of a controller's answer to an action: its refusal is
// the request's fault (409), anything else the mesh's (503).
func uiActionStatus(err error) int {
	if errors.Is(err, admin.ErrRefused) {
		return http.StatusConflict
	}
	return http.StatusServiceUnavailable
}

// securityHeaders keeps the dashboard's pages from being framed or fed other scripts.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

func (n *Node) uiChallenge(w http.ResponseWriter, _ *http.Request) {
	nonce := randomToken()
	now := time.Now()
	n.ui.mu.Lock()
	for k, exp := range n.ui.challenges {
		if now.After(exp) {
			delete(n.ui.challenges, k)
		}
	}
	for len(n.ui.challenges) >= uiMaxChallenges { // the oldest goes
		oldest := ""
		for k, exp := range n.ui.challenges {
			if oldest == "" || exp.Before(n.ui.challenges[oldest]) {
				oldest = k
			}
		}
		delete(n.ui.challenges, oldest)
	}
	n.ui.challenges[nonce] = now.Add(uiChallengeTTL)
	n.ui.mu.Unlock()
	writeJSON(w, http.StatusOK, Challenge{Node: n.id.Name, MeshID: n.id.MeshID, Nonce: nonce})
}

func (n *Node) uiLogin(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	nonce, mode := q.Get("nonce"), q.Get("mode")
	fail := func(why string) {
		http.Error(w, "login refused: "+why+"; run `meshnode ui` on the node for a new link", http.StatusForbidden)
	}
	if mode != uiModeOperator && mode != uiModeReadOnly {
		fail("unknown mode")
		return
	}
	n.ui.mu.Lock()
	exp, ok := n.ui.challenges[nonce]
	delete(n.ui.challenges, nonce) // one use, good or bad
	n.ui.mu.Unlock()
	if !ok || time.Now().After(exp) {
		fail("the link was used or has expired (they last a minute)")
		return
	}
	sig, err := base64.RawURLEncoding.DecodeString(q.Get("sig"))
	op := n.reg.Operator()
	if err != nil || op == "" {
		fail("no signature, or no operator key known to this node yet")
		return
	}
	pub, err := nkeys.FromPublicKey(op)
	if err != nil || pub.Verify(LoginMessage(n.id.MeshID, n.id.Name, nonce, mode), sig) != nil {
		fail("the link is not signed by the mesh's operator")
		return
	}
	id, s := randomToken(), &uiSession{mode: mode, csrf: randomToken(), expires: time.Now().Add(uiSessionTTL), operator: op}
	n.ui.mu.Lock()
	for k, old := range n.ui.sessions {
		if time.Now().After(old.expires) {
			delete(n.ui.sessions, k)
		}
	}
	n.ui.sessions[id] = s
	n.ui.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: uiCookie + n.id.Name, Value: id, Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, Expires: s.expires})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

// session returns the request's session while it holds: known, not expired, and signed by
// the operator's key of now.
func (n *Node) session(r *http.Request) *uiSession {
	c, err := r.Cookie(uiCookie + n.id.Name)
	if err != nil {
		return nil
	}
	n.ui.mu.Lock()
	s := n.ui.sessions[c.Value]
	n.ui.mu.Unlock()
	if s == nil || time.Now().After(s.expires) || s.operator != n.reg.Operator() {
		return nil
	}
	return s
}

// uiSessionOnly serves h to a logged-in browser; act requires an operator session, its CSRF
// token and, when the browser names one, an Origin of this host. The handler's context ends
// when the node stops, and the node's Close waits for it.
func (n *Node) uiSessionOnly(act bool, h func(http.ResponseWriter, *http.Request, *uiSession)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n.ui.watchMu.Lock()
		if n.uiCtx.Err() != nil {
			n.ui.watchMu.Unlock()
			http.Error(w, "the node is stopping", http.StatusServiceUnavailable)
			return
		}
		n.uiWG.Add(1)
		n.ui.watchMu.Unlock()
		defer n.uiWG.Done()
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(n.uiCtx, cancel)()
		r = r.WithContext(ctx)
		s := n.session(r)
		if s == nil {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not logged in: run `meshnode ui` on the node and open the link it prints"})
			return
		}
		if act {
			if s.mode != uiModeOperator {
				writeJSON(w, http.StatusForbidden, map[string]string{"error": "this session is read-only: log in with `meshnode ui` (without --read-only) to act"})
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(uiCSRFHeader)), []byte(s.csrf)) != 1 {
				writeJSON(w, http.StatusForbidden, map[string]string{"error": "missing or wrong " + uiCSRFHeader})
				return
			}
			if o := r.Header.Get("Origin"); o != "" {
				if u, err := url.Parse(o); err != nil || u.Host != r.Host {
					writeJSON(w, http.StatusForbidden, map[string]string{"error": "cross-origin action refused"})
					return
				}
			}
		}
		h(w, r, s)
	}
}

// UIState is the dashboard's snapshot of the mesh as this node sees it.
type UIState struct {
	Node      string             `json:"node"`
	MeshID    string             `json:"mesh_id"`
	Time      time.Time          `json:"time"`
	Members   []Member           `json:"members"`
	Seats     []seats.Status     `json:"seats"`
	Modules   []UIModule         `json:"modules,omitempty"` // a snapshot splices them in, encoded once per registry revision
	Edges     []UIEdge           `json:"edges,omitempty"`
	Streams   []UIStream         `json:"streams"`
	Processes []registry.Process `json:"processes"`
	Audit     []UIAudit          `json:"audit"`
	Dead      []UIDead           `json:"dead"`
	DeadTotal int                `json:"dead_total"`
	Errors    []string           `json:"errors,omitempty"` // parts that could not be read now
}

// UIModule is a registered module and its derived authority.
type UIModule struct {
	Module   string   `json:"module"`
	Emits    []string `json:"emits,omitempty"`
	Consumes []string `json:"consumes,omitempty"`
	Tools    []string `json:"tools,omitempty"`
	Uses     []string `json:"uses,omitempty"`
	Seats    []string `json:"seats,omitempty"`
	Secrets  []string `json:"secrets,omitempty"`
	Requires []string `json:"requires,omitempty"`
}

// UIEdge is who talks to whom: From's events reach To (kind "events"), or From sends work to
// a seat To declares (kind "jobs").
type UIEdge struct {
	From string `json:"from"`
	To   string `json:"to"`
	Kind string `json:"kind"`
	What string `json:"what"`
}

// UIStream is a stream and its consumers.
type UIStream struct {
	Name      string       `json:"name"`
	Messages  uint64       `json:"messages"`
	Bytes     uint64       `json:"bytes"`
	Replicas  int          `json:"replicas"`
	Consumers []UIConsumer `json:"consumers"`
}

// UIConsumer is a consumer's lag: messages not delivered yet, and delivered but not acked.
type UIConsumer struct {
	Name        string `json:"name"`
	Pending     uint64 `json:"pending"`
	AckPending  int    `json:"ack_pending"`
	Redelivered int    `json:"redelivered"`
}

// UIAudit is one record of the audit tail.
type UIAudit struct {
	N        uint64    `json:"n"`
	Received time.Time `json:"received"`
	Event    string    `json:"event"`
	Source   string    `json:"source"`
	Signed   bool      `json:"signed"`
	Body     string    `json:"body"`
}

// UIDead is one dead letter.
type UIDead struct {
	ID         uint64    `json:"id"`
	Time       time.Time `json:"time"`
	Event      string    `json:"event"`
	Consumer   string    `json:"consumer"`
	Reason     string    `json:"reason"`
	Deliveries int       `json:"deliveries"`
}

// uiSnapshot returns the snapshot as JSON.
func (n *Node) uiSnapshot(ctx context.Context) []byte {
	ctx, cancel := context.WithTimeout(ctx, uiStateTimeout)
	defer cancel()
	st := UIState{Node: n.id.Name, MeshID: n.id.MeshID, Time: time.Now().UTC().Truncate(time.Second), Members: n.Members()}
	failed := func(part string, err error) { st.Errors = append(st.Errors, part+": "+err.Error()) }
	consumers := n.ui.consumersDue()
	streams, err := n.bus.Streams(consumers)
	if err != nil {
		failed("streams", err)
	}
	backlog := map[string]uint64{}
	byStream := map[string][]UIConsumer{}
	var deadNow [2]uint64
	for _, s := range streams {
		backlog[s.Name] = s.Messages
		if s.Name == manifest.DeadStreamName {
			deadNow = [2]uint64{s.Messages, s.LastSeq}
		}
		us := UIStream{Name: s.Name, Messages: s.Messages, Bytes: s.Bytes, Replicas: s.Replicas}
		if consumers {
			us.Consumers = []UIConsumer{}
			for _, c := range s.Consumers {
				us.Consumers = append(us.Consumers, UIConsumer{Name: c.Name, Pending: c.Pending, AckPending: c.AckPending, Redelivered: c.Redelivered})
			}
			slices.SortFunc(us.Consumers, func(a, b UIConsumer) int { return strings.Compare(a.Name, b.Name) })
			byStream[s.Name] = us.Consumers
		}
		st.Streams = append(st.Streams, us)
	}
	if consumers && err == nil {
		n.ui.keepConsumers(byStream)
	} else {
		n.ui.fillConsumers(st.Streams)
	}
	slices.SortFunc(st.Streams, func(a, b UIStream) int { return strings.Compare(a.Name, b.Name) })
	if n.seats != nil {
		st.Seats = n.seats.statusWith(func(stream string) (uint64, bool) { v, ok := backlog[stream]; return v, ok })
	}
	mods := n.ui.modules(n.reg)
	js := n.bus.JetStream()
	if ps, ok := n.ui.cachedProcesses(); ok {
		st.Processes = ps
	} else if ps, err := admin.Ps(ctx, n.bus.Conn()); err != nil {
		failed("processes", err)
	} else {
		st.Processes = ps
		n.ui.keepProcesses(ps)
	}
	if tail, err := n.ui.auditTail(n.audit); err != nil {
		failed("audit", err)
	} else {
		st.Audit = tail
	}
	if ds, total, ok := n.ui.cachedDead(deadNow); ok {
		st.Dead, st.DeadTotal = ds, total // DEAD has not changed
	} else if dead, err := js.Stream(ctx, manifest.DeadStreamName); err != nil {
		failed("dead letters", err)
	} else if ds, total, err := deadletter.Newest(ctx, dead, uiDeadShown); err != nil {
		failed("dead letters", err)
	} else {
		st.DeadTotal = total
		for _, d := range ds {
			st.Dead = append(st.Dead, UIDead{ID: d.ID, Time: d.Time, Event: strings.TrimPrefix(d.Subject, "mesh."),
				Consumer: d.Consumer, Reason: d.Reason, Deliveries: d.Deliveries})
		}
		n.ui.keepDead(st.Dead, total, deadNow)
	}
	// The modules and edges go in as encoded once per registry revision: most of the bytes,
	// and they change least. They are spliced in, not marshalled as json.RawMessage, which
	// would check and compact them again each time.
	b, err := json.Marshal(st)
	if err != nil || len(b) < 2 {
		b = []byte(`{"errors":["the snapshot could not be encoded"]}`)
	}
	out := make([]byte, 0, len(b)+len(mods.modules)+len(mods.edges)+32)
	out = append(out, b[:len(b)-1]...)
	out = append(out, `,"modules":`...)
	out = append(out, mods.modules...)
	out = append(out, `,"edges":`...)
	out = append(out, mods.edges...)
	return append(out, '}')
}

// consumersDue says whether a snapshot reads the consumers again (every uiConsumersEvery;
// between, it shows the last it read).
func (u *uiState) consumersDue() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.consumers == nil || time.Since(u.consumersAt) >= uiConsumersEvery
}

func (u *uiState) keepConsumers(byStream map[string][]UIConsumer) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.consumers, u.consumersAt = byStream, time.Now()
}

// cachedProcesses returns ps as last read, unless it is uiProcessesEvery old.
func (u *uiState) cachedProcesses() ([]registry.Process, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.processes, u.processes != nil && time.Since(u.processesAt) < uiProcessesEvery
}

// forgetProcesses has the next snapshot ask for ps, after an action changed it.
func (u *uiState) forgetProcesses() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.processesAt = time.Time{}
}

func (u *uiState) keepProcesses(ps []registry.Process) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if ps == nil {
		ps = []registry.Process{}
	}
	u.processes, u.processesAt = ps, time.Now()
}

// cachedDead returns the dead letters as last read, if DEAD still stands as it did then
// (its messages and last sequence: at).
func (u *uiState) cachedDead(at [2]uint64) ([]UIDead, int, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.dead, u.deadTotal, at != [2]uint64{} && at == u.deadAt
}

func (u *uiState) keepDead(dead []UIDead, total int, at [2]uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.dead, u.deadTotal, u.deadAt = dead, total, at
}

// fillConsumers gives each stream the consumers last read of it.
func (u *uiState) fillConsumers(streams []UIStream) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := range streams {
		streams[i].Consumers = u.consumers[streams[i].Name]
	}
}

// auditTail returns the newest uiAuditTail records of l, newest first, read again only
// when l changed since the last time.
func (u *uiState) auditTail(l *audit.Logger) ([]UIAudit, error) {
	at := l.Changes()
	u.mu.Lock()
	if u.audit != nil && u.auditAt == at {
		defer u.mu.Unlock()
		return u.audit, nil
	}
	u.mu.Unlock()
	recs, err := l.Query(audit.Filter{Last: uiAuditTail})
	if err != nil {
		return nil, err
	}
	tail := []UIAudit{}
	for _, r := range slices.Backward(recs) {
		tail = append(tail, UIAudit{N: r.N, Received: r.Received, Event: strings.TrimPrefix(r.Subject, "mesh."),
			Source: r.Source, Signed: r.Signed, Body: clipBody(r.Body)})
	}
	u.mu.Lock()
	u.audit, u.auditAt = tail, at
	u.mu.Unlock()
	return tail, nil
}

func clipBody(b []byte) string {
	const most = 200
	if len(b) > most {
		return string(b[:most]) + "…"
	}
	return string(b)
}

// encodedModules are a snapshot's modules and edges, JSON-encoded.
type encodedModules struct{ modules, edges json.RawMessage }

// modules returns uiModules of the registry, encoded, made again only when the registry
// changed.
func (u *uiState) modules(reg *registry.Registry) encodedModules {
	rev := reg.Revision()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.modsRev != rev || u.mods.modules == nil {
		mods, edges := uiModules(reg.List())
		if edges == nil {
			edges = []UIEdge{}
		}
		u.mods.modules, _ = json.Marshal(mods)
		u.mods.edges, _ = json.Marshal(edges)
		u.modsRev = rev
	}
	return u.mods
}

// uiModules lists the modules' authority and who talks to whom: an emitter's events reach
// each module whose consumes match them, a seat's users send it work. A pattern without a
// wildcard is looked up; only wildcard patterns are matched against every event.
func uiModules(entries []*registry.Entry) ([]UIModule, []UIEdge) {
	mods := make([]UIModule, 0, len(entries))
	declarer := map[string]string{}
	for _, e := range entries {
		m := e.Manifest
		um := UIModule{Module: e.Module, Emits: m.Emits, Consumes: m.Consumes, Tools: m.Tools, Uses: m.Uses, Secrets: m.Secrets, Requires: m.Requires}
		for _, s := range m.Seats {
			um.Seats = append(um.Seats, s.Name)
			declarer[s.Name] = e.Module
		}
		mods = append(mods, um)
	}
	slices.SortFunc(mods, func(a, b UIModule) int { return strings.Compare(a.Module, b.Module) })
	type emitted struct{ module, event string }
	byKey := map[string]emitted{}
	var all []emitted
	for _, m := range mods {
		for _, ev := range m.Emits {
			e := emitted{m.Module, ev}
			byKey[m.Module+"."+ev] = e
			all = append(all, e)
		}
	}
	var edges []UIEdge
	for _, to := range mods {
		for _, pattern := range to.Consumes {
			if !strings.Contains(pattern, "*") {
				if e, ok := byKey[pattern]; ok {
					edges = append(edges, UIEdge{From: e.module, To: to.Module, Kind: "events", What: e.event})
				}
				continue
			}
			for _, e := range all {
				if manifest.Matches(pattern, e.module+"."+e.event) {
					edges = append(edges, UIEdge{From: e.module, To: to.Module, Kind: "events", What: e.event})
				}
			}
		}
		for _, seat := range to.Uses {
			if d, ok := declarer[seat]; ok {
				edges = append(edges, UIEdge{From: to.Module, To: d, Kind: "jobs", What: seat})
			}
		}
	}
	return mods, edges
}

// uiEvents streams snapshots (server-sent events) while they change, until the browser
// leaves or the node stops. One loop makes them for every watcher.
func (n *Node) uiEvents(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	ch := make(chan []byte, 1)
	n.ui.watchMu.Lock()
	n.ui.watchers[ch] = struct{}{}
	if last := n.ui.last; last != nil {
		ch <- last
	}
	if !n.ui.running {
		n.ui.running = true
		n.uiWG.Add(1)
		go n.uiLoop()
	}
	n.ui.watchMu.Unlock()
	defer func() {
		n.ui.watchMu.Lock()
		delete(n.ui.watchers, ch)
		n.ui.watchMu.Unlock()
	}()
	fmt.Fprint(w, ": meshnode\n\n")
	flusher.Flush()
	for {
		select {
		case <-r.Context().Done(): // the browser left, or the node stops
			return
		case b := <-ch:
			if n.session(r) == nil {
				return // logged out, expired, or the operator's key changed
			}
			fmt.Fprintf(w, "event: state\ndata: %s\n\n", b)
			flusher.Flush()
		}
	}
}

// UIWatchers is how many dashboard pages' live streams the node is serving now.
func (n *Node) UIWatchers() int {
	n.ui.watchMu.Lock()
	defer n.ui.watchMu.Unlock()
	return len(n.ui.watchers)
}

// uiLoop makes a snapshot every uiTick while anyone watches, and sends it to each watcher
// when it changed.
func (n *Node) uiLoop() {
	defer n.uiWG.Done()
	t := time.NewTicker(uiTick)
	defer t.Stop()
	for {
		n.ui.watchMu.Lock()
		if len(n.ui.watchers) == 0 {
			n.ui.running, n.ui.last = false, nil
			n.ui.watchMu.Unlock()
			return
		}
		n.ui.watchMu.Unlock()
		b := n.uiSnapshot(n.uiCtx)
		n.ui.watchMu.Lock()
		if !bytes.Equal(uiComparable(b), uiComparable(n.ui.last)) {
			n.ui.last = b
			for ch := range n.ui.watchers {
				select {
				case <-ch: // a slow watcher gets the newest only
				default:
				}
				ch <- b
			}
		}
		n.ui.watchMu.Unlock()
		select {
		case <-n.uiCtx.Done():
			return
		case <-t.C:
		}
	}
}

// uiComparable is a snapshot without its time, which changes every second.
func uiComparable(b []byte) []byte {
	if i := bytes.Index(b, []byte(`"time":"`)); i >= 0 {
		if j := bytes.IndexByte(b[i+8:], '"'); j >= 0 {
			return append(b[:i:i], b[i+8+j:]...)
		}
	}
	return b
}

// uiDeadAction replays or drops a dead letter, as `meshnode dead replay|drop` does.
func (n *Node) uiDeadAction(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	action := r.PathValue("action")
	if err != nil || (action != "replay" && action != "drop") {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "POST /ui/api/dead/<id>/replay or /drop"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), uiStateTimeout)
	defer cancel()
	js := n.bus.JetStream()
	dead, err := js.Stream(ctx, manifest.DeadStreamName)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	m, err := dead.GetMsg(ctx, id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no dead letter %d (replayed or dropped?)", id)})
		return
	}
	if err == nil {
		if action == "drop" {
			err = dead.DeleteMsg(ctx, id)
		} else {
			var auth deadletter.Authority
			if auth, err = deadletter.LoadAuthority(ctx, js, admin.List); err == nil {
				err = deadletter.Replay(ctx, js, dead, m, auth)
			}
		}
	}
	if errors.Is(err, deadletter.ErrNotReplayable) {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	n.log.Info("dead letter "+action+"ed from the dashboard", "id", id)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "action": action})
}
