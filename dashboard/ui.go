package dashboard

import (
	"bytes"
	"cmp"
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
	"time"

	"github.com/meshnode/meshnode/envelope"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/deadletter"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
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
var files embed.FS

// Bounds of the dashboard.
const (
	challengeTTL   = time.Minute
	sessionTTL     = 12 * time.Hour
	maxChallenges  = 64               // outstanding challenges; older ones are dropped
	tick           = time.Second      // how often the snapshot is made while someone watches
	auditShown     = 50               // audit records in a snapshot
	consumersEvery = 5 * time.Second  // how often a snapshot reads every consumer's lag again
	processesEvery = 2 * time.Second  // how often a snapshot asks the controller for ps again
	actionTimeout  = 30 * time.Second // a deploy or undeploy, as long as the CLI waits
	deadShown      = 100              // dead letters in a snapshot (the newest)
	cookiePrefix   = "meshnode_ui_"   // the session cookie's name, before the node's (cookies ignore ports)
	csrfHeader     = "X-CSRF-Token"   // an action's header
	loginPrefix    = "meshnode-ui:"   // what the operator's signature covers: prefix, mesh, nonce, mode
	modeOperator   = "operator"       // may act
	modeReadOnly   = "read-only"      // sees only
	stateTimeout   = 5 * time.Second  // one snapshot
)

// session is one logged-in browser, as its signed cookie says (session.go).
type session struct {
	id       string
	mode     string
	csrf     string
	expires  time.Time
	operator string // the operator's key that signed it: a session ends when the key changes
}

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// LoginMessage is what the operator signs to log in a browser: the mesh, the node, the
// node's nonce and the session's mode. A signature for one node logs in to no other.
func LoginMessage(meshID, node, nonce, mode string) []byte {
	return []byte(loginPrefix + meshID + ":" + node + ":" + nonce + ":" + mode)
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
// listening on the address) is refused unsigned. client asks (one that trusts the mesh's CA
// for a node serving HTTPS beyond loopback); nil: http.DefaultClient.
func LoginLink(ctx context.Context, client *http.Client, httpURL string, key nkeys.KeyPair, readOnly bool, want Challenge) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(httpURL, "/")+"/ui/challenge", nil)
	if err != nil {
		return "", err
	}
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
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
	return SignLogin(httpURL, key, readOnly, ch)
}

// SignLogin signs ch with key (the operator's) and returns the one-time link that logs a
// browser in to the dashboard at httpURL: how `meshnode ui` answers a challenge it got over
// HTTP (LoginLink) or over the bus (the node's ui tool, for a node whose HTTP address this
// machine reaches only through a tunnel).
func SignLogin(httpURL string, key nkeys.KeyPair, readOnly bool, ch Challenge) (string, error) {
	mode := modeOperator
	if readOnly {
		mode = modeReadOnly
	}
	sig, err := key.Sign(LoginMessage(ch.MeshID, ch.Node, ch.Nonce, mode))
	if err != nil {
		return "", err
	}
	q := url.Values{"nonce": {ch.Nonce}, "mode": {mode}, "sig": {base64.RawURLEncoding.EncodeToString(sig)}}
	return strings.TrimSuffix(httpURL, "/") + "/ui/login?" + q.Encode(), nil
}

// routes adds the dashboard's routes to mux.
func (d *Dashboard) routes(mux *http.ServeMux) {
	static, _ := fs.Sub(files, "ui")
	files := http.FileServerFS(static)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusFound) })
	mux.Handle("GET /ui/", http.StripPrefix("/ui/", securityHeaders(files)))
	mux.HandleFunc("GET /ui/challenge", d.challenge)
	mux.HandleFunc("GET /ui/login", d.login)
	mux.HandleFunc("POST /ui/logout", d.sessionOnly(false, func(w http.ResponseWriter, r *http.Request, s *session) {
		if err := d.cfg.Sessions.Revoke(s.id, s.expires); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "log out: " + err.Error()})
			return
		}
		http.SetCookie(w, &http.Cookie{Name: cookiePrefix + d.cfg.Node, Path: "/ui", MaxAge: -1})
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("GET /ui/api/session", d.sessionOnly(false, func(w http.ResponseWriter, _ *http.Request, s *session) {
		writeJSON(w, http.StatusOK, map[string]string{"node": d.cfg.Node, "mesh_id": d.cfg.MeshID, "mode": s.mode, "csrf": s.csrf})
	}))
	mux.HandleFunc("GET /ui/api/state", d.sessionOnly(false, func(w http.ResponseWriter, r *http.Request, _ *session) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(d.snapshot(r.Context()))
	}))
	mux.HandleFunc("GET /ui/api/events", d.sessionOnly(false, d.events))
	mux.HandleFunc("GET /ui/api/audit", d.sessionOnly(false, d.auditSearch))
	mux.HandleFunc("GET /ui/api/modules/{name}", d.sessionOnly(false, d.modulePage))
	mux.HandleFunc("GET /ui/api/dead/{id}", d.sessionOnly(false, d.deadLetter))
	mux.HandleFunc("POST /ui/api/dead/{id}/{action}", d.sessionOnly(true, d.deadAction))
	mux.HandleFunc("POST /ui/api/dead-replay-all", d.sessionOnly(true, d.deadReplayAll))
	mux.HandleFunc("POST /ui/api/deploy", d.sessionOnly(true, d.deployModule))
	mux.HandleFunc("POST /ui/api/undeploy", d.sessionOnly(true, d.undeploy))
}

// DeployRequest is the dashboard's deploy form: what `meshnode deploy` takes.
type DeployRequest struct {
	Module    string   `json:"module"`
	Version   string   `json:"version"`
	Nodes     []string `json:"nodes,omitempty"` // none: every node
	Instances int      `json:"instances,omitempty"`
}

// deployModule deploys a module's artifact version, as `meshnode deploy` does: the controller
// checks it and answers.
func (d *Dashboard) deployModule(w http.ResponseWriter, r *http.Request, s *session) {
	var req DeployRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil || req.Module == "" || req.Version == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `POST /ui/api/deploy {"module", "version", "nodes"?: [...], "instances"?: n}: module and version are required`})
		return
	}
	dep := api.Deployment{Version: req.Version, Nodes: req.Nodes, All: len(req.Nodes) == 0, Instances: max(req.Instances, 1)}
	if e, ok := d.cfg.Registry.Get(req.Module); ok && e.Deployment != nil {
		// The form sets where, what and how many; the rest stays as the CLI last set it.
		dep.Env, dep.Args, dep.Auto = e.Deployment.Env, e.Deployment.Args, e.Deployment.Auto
	}
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	reply, err := admin.Deploy(ctx, d.cfg.Conn, api.DeployRequest{Module: req.Module, Deployment: dep})
	d.record(s, "deploy", req.Module, fmt.Sprintf("version %s, nodes %v, instances %d", req.Version, req.Nodes, dep.Instances), err)
	if err != nil {
		writeJSON(w, actionStatus(err), map[string]string{"error": err.Error()})
		return
	}
	d.cfg.Log.Info("deployed from the dashboard", "module", req.Module, "version", req.Version, "nodes", req.Nodes)
	d.forgetProcesses() // the next snapshot asks for ps again
	writeJSON(w, http.StatusOK, reply)
}

// undeploy stops a module everywhere, as `meshnode undeploy` does.
func (d *Dashboard) undeploy(w http.ResponseWriter, r *http.Request, s *session) {
	var req api.UndeployRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil || req.Module == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `POST /ui/api/undeploy {"module", "nodes"?: [...]}: module is required`})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	reply, err := admin.Undeploy(ctx, d.cfg.Conn, req)
	d.record(s, "undeploy", req.Module, fmt.Sprintf("nodes %v", req.Nodes), err)
	if err != nil {
		writeJSON(w, actionStatus(err), map[string]string{"error": err.Error()})
		return
	}
	d.cfg.Log.Info("undeployed from the dashboard", "module", req.Module, "nodes", req.Nodes)
	d.forgetProcesses()
	writeJSON(w, http.StatusOK, reply)
}

// record hands an action the operator took to the node's audit (Config.Record).
func (d *Dashboard) record(s *session, action, target, detail string, err error) {
	if d.cfg.Record == nil {
		return
	}
	a := ConsoleAction{Operator: s.operator, Action: action, Target: target, Detail: detail}
	if err != nil {
		a.Error = err.Error()
	}
	d.cfg.Record(a)
}

// actionStatus is the HTTP status of a controller's answer to an action: its refusal is
// the request's fault (409), anything else the mesh's (503).
func actionStatus(err error) int {
	if errors.Is(err, admin.ErrRefused) {
		return http.StatusConflict
	}
	return http.StatusServiceUnavailable
}

// writeJSON answers v, indented, as the node's API does.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
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

func (d *Dashboard) challenge(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, d.NewChallenge())
}

// NewChallenge makes a login challenge: its nonce, signed by the operator within a minute,
// logs one browser in (GET /ui/challenge, and the node's ui tool).
func (d *Dashboard) NewChallenge() Challenge {
	nonce := randomToken()
	now := time.Now()
	d.mu.Lock()
	for k, exp := range d.challenges {
		if now.After(exp) {
			delete(d.challenges, k)
		}
	}
	for len(d.challenges) >= maxChallenges { // the oldest goes
		oldest := ""
		for k, exp := range d.challenges {
			if oldest == "" || exp.Before(d.challenges[oldest]) {
				oldest = k
			}
		}
		delete(d.challenges, oldest)
	}
	d.challenges[nonce] = now.Add(challengeTTL)
	d.mu.Unlock()
	return Challenge{Node: d.cfg.Node, MeshID: d.cfg.MeshID, Nonce: nonce}
}

func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	nonce, mode := q.Get("nonce"), q.Get("mode")
	fail := func(why string) {
		http.Error(w, "login refused: "+why+"; run `meshnode ui` on the node for a new link", http.StatusForbidden)
	}
	if mode != modeOperator && mode != modeReadOnly {
		fail("unknown mode")
		return
	}
	d.mu.Lock()
	exp, ok := d.challenges[nonce]
	delete(d.challenges, nonce) // one use, good or bad
	d.mu.Unlock()
	if !ok || time.Now().After(exp) {
		fail("the link was used or has expired (they last a minute)")
		return
	}
	sig, err := base64.RawURLEncoding.DecodeString(q.Get("sig"))
	op := d.cfg.Registry.Operator()
	if err != nil || op == "" {
		fail("no signature, or no operator key known to this node yet")
		return
	}
	pub, err := nkeys.FromPublicKey(op)
	if err != nil || pub.Verify(LoginMessage(d.cfg.MeshID, d.cfg.Node, nonce, mode), sig) != nil {
		fail("the link is not signed by the mesh's operator")
		return
	}
	key, err := d.cfg.Sessions.SessionKey()
	if err != nil {
		http.Error(w, "login failed: "+err.Error()+"; see the node's log", http.StatusServiceUnavailable)
		return
	}
	// Whole seconds: the cookie says its expiry in seconds, and checks it to the second.
	expires := time.Now().Add(sessionTTL).Truncate(time.Second)
	value := signSession(key, d.cfg.Node, sessionClaims{ID: randomToken(), Mode: mode, Expires: expires.Unix(), Operator: op})
	http.SetCookie(w, &http.Cookie{Name: cookiePrefix + d.cfg.Node, Value: value, Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, Expires: expires})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

// sessionOf returns the request's session while it holds: signed by this node, not expired,
// not logged out, and logged in with the operator's key of now.
func (d *Dashboard) sessionOf(r *http.Request) *session {
	cookie, err := r.Cookie(cookiePrefix + d.cfg.Node)
	if err != nil {
		return nil
	}
	key, err := d.cfg.Sessions.SessionKey()
	if err != nil {
		return nil
	}
	c, err := openSession(key, d.cfg.Node, cookie.Value, time.Now())
	if err != nil || c.Operator != d.cfg.Registry.Operator() || d.cfg.Sessions.Revoked(c.ID) {
		return nil
	}
	return &session{id: c.ID, mode: c.Mode, csrf: csrfOf(key, c.ID), expires: time.Unix(c.Expires, 0), operator: c.Operator}
}

// sessionOnly serves h to a logged-in browser; act requires an operator session, its CSRF
// token and, when the browser names one, an Origin of this host. The handler's context ends
// when the dashboard closes, and Close waits for it.
func (d *Dashboard) sessionOnly(act bool, h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d.watchMu.Lock()
		if d.ctx.Err() != nil {
			d.watchMu.Unlock()
			http.Error(w, "the node is stopping", http.StatusServiceUnavailable)
			return
		}
		d.wg.Add(1)
		d.watchMu.Unlock()
		defer d.wg.Done()
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(d.ctx, cancel)()
		r = r.WithContext(ctx)
		s := d.sessionOf(r)
		if s == nil {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not logged in: run `meshnode ui` on the node and open the link it prints"})
			return
		}
		if act {
			if s.mode != modeOperator {
				writeJSON(w, http.StatusForbidden, map[string]string{"error": "this session is read-only: log in with `meshnode ui` (without --read-only) to act"})
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(csrfHeader)), []byte(s.csrf)) != 1 {
				writeJSON(w, http.StatusForbidden, map[string]string{"error": "missing or wrong " + csrfHeader})
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

// State is the dashboard's snapshot of the mesh as this node sees it.
type State struct {
	Node    string           `json:"node"`
	MeshID  string           `json:"mesh_id"`
	Time    time.Time        `json:"time"`
	Members []Member         `json:"members"`
	Seats   []api.SeatStatus `json:"seats"`
	Modules []Module         `json:"modules,omitempty"` // a snapshot splices them in, encoded once per registry revision
	// Quotas are the modules' use of EVENTS against their quota, by module: they change with
	// every event, so they stay out of the modules, which change with the registry. A module
	// that holds nothing and was never refused is left out (QuotaLimit is its quota): at
	// 1,000 modules the snapshot, made every second, was mostly zeros.
	Quotas     map[string]api.QuotaUse `json:"quotas,omitempty"`
	QuotaLimit int64                   `json:"quota_limit,omitempty"`
	Edges      []Edge                  `json:"edges,omitempty"`
	Streams    []Stream                `json:"streams"`
	Processes  []api.Process           `json:"processes"`
	Audit      []AuditRecord           `json:"audit"`
	// NotGenuine counts the audit log's records that are not genuine events since the node
	// started, by kind: a banner, so that a forged event does not scroll away unseen.
	NotGenuine map[string]uint64 `json:"not_genuine,omitempty"`
	Dead       []DeadLetter      `json:"dead"`
	DeadTotal  int               `json:"dead_total"`
	Rates      *Rates            `json:"rates,omitempty"` // events and errors over the last hour

	Errors []string `json:"errors,omitempty"` // parts that could not be read now
}

// Member is one server of the mesh, as the node's /v1/members shows it.
type Member struct {
	Name       string   `json:"name"`
	Address    string   `json:"address"`               // its client URL, as api.NodeMember's
	GossipAddr string   `json:"gossip_addr,omitempty"` // its gossip host:port; "" for a single node
	State      string   `json:"state"`                 // alive, suspect, dead, left
	JetStream  string   `json:"jetstream"`             // leader, follower, offline, none or standalone
	Seats      []string `json:"seats"`                 // the seats held by this node or its modules
	Version    string   `json:"version,omitempty"`     // its meshnode version, as api.NodeMember's
}

// Module is a registered module and its derived authority.
type Module struct {
	Module   string   `json:"module"`
	Emits    []string `json:"emits,omitempty"`
	Consumes []string `json:"consumes,omitempty"`
	Tools    []string `json:"tools,omitempty"`
	Uses     []string `json:"uses,omitempty"`
	Seats    []string `json:"seats,omitempty"`
	Secrets  []string `json:"secrets,omitempty"`
	Requires []string `json:"requires,omitempty"`
}

// Edge is who talks to whom: From's events reach To (kind "events"), or From sends work to
// a seat To declares (kind "jobs").
type Edge struct {
	From string `json:"from"`
	To   string `json:"to"`
	Kind string `json:"kind"`
	What string `json:"what"`
}

// Stream is a stream and its consumers.
type Stream struct {
	Name      string     `json:"name"`
	Messages  uint64     `json:"messages"`
	Bytes     uint64     `json:"bytes"`
	Replicas  int        `json:"replicas"`
	Consumers []Consumer `json:"consumers"`
}

// Consumer is a consumer's lag: messages not delivered yet, and delivered but not acked.
type Consumer struct {
	Name        string `json:"name"`
	Pending     uint64 `json:"pending"`
	AckPending  int    `json:"ack_pending"`
	Redelivered int    `json:"redelivered"`
}

// AuditRecord is one record of the audit tail.
type AuditRecord struct {
	N        uint64    `json:"n"`
	Received time.Time `json:"received"`
	Event    string    `json:"event"`
	Source   string    `json:"source"`
	Signed   bool      `json:"signed"`
	// Check is "ok" for a genuine event, else the kind `audit verify` flags it with.
	Check string `json:"check"`
	Body  string `json:"body"`
}

// DeadLetter is one dead letter.
type DeadLetter struct {
	ID         uint64    `json:"id"`
	Time       time.Time `json:"time"`
	Event      string    `json:"event"`
	Consumer   string    `json:"consumer"`
	Reason     string    `json:"reason"`
	Deliveries int       `json:"deliveries"`
}

// snapshot returns the snapshot as JSON.
func (d *Dashboard) snapshot(ctx context.Context) []byte {
	ctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	st := State{Node: d.cfg.Node, MeshID: d.cfg.MeshID, Time: time.Now().UTC().Truncate(time.Second), Members: d.cfg.Mesh.Members()}
	if d.cfg.Quotas != nil {
		st.Quotas = map[string]api.QuotaUse{}
		for _, u := range d.cfg.Quotas() {
			st.QuotaLimit = u.Limit
			if !u.Idle() {
				st.Quotas[u.Module] = u
			}
		}
	}
	failed := func(part string, err error) { st.Errors = append(st.Errors, part+": "+err.Error()) }
	consumers := d.consumersDue()
	streams, err := d.cfg.Mesh.Streams(consumers)
	if err != nil {
		failed("streams", err)
	}
	backlog := map[string]uint64{}
	byStream := map[string][]Consumer{}
	var deadNow [2]uint64
	for _, s := range streams {
		backlog[s.Name] = s.Messages
		if s.Name == manifest.DeadStreamName {
			deadNow = [2]uint64{s.Messages, s.LastSeq}
		}
		us := Stream{Name: s.Name, Messages: s.Messages, Bytes: s.Bytes, Replicas: s.Replicas}
		if consumers {
			us.Consumers = consumersOf(s.Consumers)
			byStream[s.Name] = us.Consumers
		}
		st.Streams = append(st.Streams, us)
	}
	if consumers && err == nil {
		d.keepConsumers(byStream)
	} else {
		d.fillConsumers(st.Streams)
	}
	slices.SortFunc(st.Streams, func(a, b Stream) int { return strings.Compare(a.Name, b.Name) })
	st.Seats = d.cfg.Mesh.Seats(func(stream string) (uint64, bool) { v, ok := backlog[stream]; return v, ok })
	mods := d.modules()
	js := d.cfg.JetStream
	if ps, err := d.currentProcesses(ctx); err != nil {
		failed("processes", err)
	} else {
		st.Processes = ps
	}
	if tail, err := d.auditTail(); err != nil {
		failed("audit", err)
	} else {
		st.Audit = tail
	}
	if d.rates != nil {
		st.Rates = d.rates.rates()
	}
	for kind, n := range d.cfg.Audit.NotGenuine() {
		if n > 0 {
			if st.NotGenuine == nil {
				st.NotGenuine = map[string]uint64{}
			}
			st.NotGenuine[kind] = n
		}
	}
	if ds, total, ok := d.cachedDead(deadNow); ok {
		st.Dead, st.DeadTotal = ds, total // DEAD has not changed
	} else if dead, err := js.Stream(ctx, manifest.DeadStreamName); err != nil {
		failed("dead letters", err)
	} else if ds, total, err := deadletter.Newest(ctx, dead, deadShown); err != nil {
		failed("dead letters", err)
	} else {
		st.DeadTotal = total
		for _, d := range ds {
			st.Dead = append(st.Dead, DeadLetter{ID: d.ID, Time: d.Time, Event: envelope.Key(d.Subject),
				Consumer: d.Consumer, Reason: d.Reason, Deliveries: d.Deliveries})
		}
		d.keepDead(st.Dead, total, deadNow)
	}
	return st.encode(mods)
}

// encode is the snapshot as JSON, mods spliced in. The modules and edges go in as encoded
// once per registry revision: most of the bytes, and they change least. They are spliced
// in, not marshalled as json.RawMessage, which would check and compact them again each time.
func (st State) encode(mods encodedModules) []byte {
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

// consumersDue says whether a snapshot reads the consumers again (every consumersEvery;
// between, it shows the last it read).
func (d *Dashboard) consumersDue() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.consumers == nil || time.Since(d.consumersAt) >= consumersEvery
}

func (d *Dashboard) keepConsumers(byStream map[string][]Consumer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.consumers, d.consumersAt = byStream, time.Now()
}

// cachedProcesses returns ps as last read, unless it is processesEvery old.
func (d *Dashboard) cachedProcesses() ([]api.Process, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.processes, d.processes != nil && time.Since(d.processesAt) < processesEvery
}

// forgetProcesses has the next snapshot ask for ps, after an action changed it.
func (d *Dashboard) forgetProcesses() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.processesAt = time.Time{}
}

func (d *Dashboard) keepProcesses(ps []api.Process) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ps == nil {
		ps = []api.Process{}
	}
	d.processes, d.processesAt = ps, time.Now()
}

// cachedDead returns the dead letters as last read, if DEAD still stands as it did then
// (its messages and last sequence: at).
func (d *Dashboard) cachedDead(at [2]uint64) ([]DeadLetter, int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dead, d.deadTotal, at != [2]uint64{} && at == d.deadAt
}

func (d *Dashboard) keepDead(dead []DeadLetter, total int, at [2]uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead, d.deadTotal, d.deadAt = dead, total, at
}

// fillConsumers gives each stream the consumers last read of it.
func (d *Dashboard) fillConsumers(streams []Stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range streams {
		streams[i].Consumers = d.consumers[streams[i].Name]
	}
}

// consumersOf lists a stream's durable consumers (a watch's or a fetch's ephemeral ones,
// named at random, are counted in nothing the console shows), sorted by name.
func consumersOf(cs []embedbus.ConsumerState) []Consumer {
	out := []Consumer{}
	for _, c := range cs {
		if c.Durable {
			out = append(out, Consumer{Name: c.Name, Pending: c.Pending, AckPending: c.AckPending, Redelivered: c.Redelivered})
		}
	}
	slices.SortFunc(out, func(a, b Consumer) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// auditTail returns the newest auditShown records of the audit log, newest first, read
// again only when the log changed since the last time.
func (d *Dashboard) auditTail() ([]AuditRecord, error) {
	at := d.cfg.Audit.Changes()
	d.mu.Lock()
	if d.audit != nil && d.auditAt == at {
		defer d.mu.Unlock()
		return d.audit, nil
	}
	d.mu.Unlock()
	recs, err := d.cfg.Audit.Query(api.AuditFilter{Last: auditShown})
	if err != nil {
		return nil, err
	}
	tail := []AuditRecord{}
	for _, r := range slices.Backward(recs) {
		tail = append(tail, auditRecordOf(r))
	}
	d.mu.Lock()
	d.audit, d.auditAt = tail, at
	d.mu.Unlock()
	return tail, nil
}

// auditRecordOf is a record of the audit log as the console shows it.
func auditRecordOf(r api.AuditRecord) AuditRecord {
	return AuditRecord{N: r.N, Received: r.Received, Event: envelope.Key(r.Subject),
		Source: r.Source, Signed: r.Signed, Check: cmp.Or(r.NotGenuine, "ok"), Body: clipBody(r.Body)}
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

// moduleGraphAt is moduleGraph of the registry at revision rev, and its encoding.
type moduleGraphAt struct {
	rev     uint64
	mods    []Module
	edges   []Edge
	encoded encodedModules
}

// graph returns moduleGraph of the registry, made again only when the registry changed.
func (d *Dashboard) graph() *moduleGraphAt {
	rev := d.cfg.Registry.Revision()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mods == nil || d.mods.rev != rev {
		d.mods = newModuleGraph(rev, d.cfg.Registry.List())
	}
	return d.mods
}

// newModuleGraph is moduleGraph of entries, the registry's at revision rev, and its encoding.
func newModuleGraph(rev uint64, entries []*registry.Entry) *moduleGraphAt {
	g := &moduleGraphAt{rev: rev}
	g.mods, g.edges = moduleGraph(entries)
	if g.edges == nil {
		g.edges = []Edge{}
	}
	g.encoded.modules, _ = json.Marshal(g.mods)
	g.encoded.edges, _ = json.Marshal(g.edges)
	return g
}

// modules returns the graph's modules and edges, encoded.
func (d *Dashboard) modules() encodedModules { return d.graph().encoded }

// moduleGraph lists the modules' authority and who talks to whom: an emitter's events reach
// each module whose consumes match them, a seat's users send it work. A pattern without a
// wildcard is looked up; only wildcard patterns are matched against every event.
func moduleGraph(entries []*registry.Entry) ([]Module, []Edge) {
	mods := make([]Module, 0, len(entries))
	declarer := map[string]string{}
	for _, e := range entries {
		m := e.Manifest
		um := Module{Module: e.Module, Emits: m.Emits, Consumes: m.Consumes, Tools: m.Tools, Uses: m.Uses, Secrets: m.Secrets, Requires: m.Requires}
		for _, s := range m.Seats {
			um.Seats = append(um.Seats, s.Name)
			declarer[s.Name] = e.Module
		}
		mods = append(mods, um)
	}
	slices.SortFunc(mods, func(a, b Module) int { return strings.Compare(a.Module, b.Module) })
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
	var edges []Edge
	for _, to := range mods {
		for _, pattern := range to.Consumes {
			if !strings.Contains(pattern, "*") {
				if e, ok := byKey[pattern]; ok {
					edges = append(edges, Edge{From: e.module, To: to.Module, Kind: "events", What: e.event})
				}
				continue
			}
			for _, e := range all {
				if manifest.Matches(pattern, e.module+"."+e.event) {
					edges = append(edges, Edge{From: e.module, To: to.Module, Kind: "events", What: e.event})
				}
			}
		}
		for _, seat := range to.Uses {
			if d, ok := declarer[seat]; ok {
				edges = append(edges, Edge{From: to.Module, To: d, Kind: "jobs", What: seat})
			}
		}
	}
	return mods, edges
}

// events streams snapshots (server-sent events) while they change, until the browser
// leaves or the dashboard closes. One loop makes them for every watcher.
func (d *Dashboard) events(w http.ResponseWriter, r *http.Request, _ *session) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	ch := make(chan []byte, 1)
	d.watchMu.Lock()
	d.watchers[ch] = struct{}{}
	if last := d.last; last != nil {
		ch <- last
	}
	if !d.running {
		d.running = true
		d.wg.Add(1)
		go d.loop()
	}
	d.watchMu.Unlock()
	defer func() {
		d.watchMu.Lock()
		delete(d.watchers, ch)
		d.watchMu.Unlock()
	}()
	fmt.Fprint(w, ": meshnode\n\n")
	flusher.Flush()
	for {
		select {
		case <-r.Context().Done(): // the browser left, or the dashboard closes
			return
		case b := <-ch:
			if d.sessionOf(r) == nil {
				return // logged out, expired, or the operator's key changed
			}
			fmt.Fprintf(w, "event: state\ndata: %s\n\n", b)
			flusher.Flush()
		}
	}
}

// loop makes a snapshot every tick while anyone watches, and sends it to each watcher
// when it changed.
func (d *Dashboard) loop() {
	defer d.wg.Done()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		d.watchMu.Lock()
		if len(d.watchers) == 0 {
			d.running, d.last = false, nil
			d.watchMu.Unlock()
			return
		}
		d.watchMu.Unlock()
		b := d.snapshot(d.ctx)
		d.watchMu.Lock()
		if !bytes.Equal(withoutTime(b), withoutTime(d.last)) {
			d.last = b
			for ch := range d.watchers {
				select {
				case <-ch: // a slow watcher gets the newest only
				default:
				}
				ch <- b
			}
		}
		d.watchMu.Unlock()
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// withoutTime is a snapshot without its time, which changes every second.
func withoutTime(b []byte) []byte {
	if i := bytes.Index(b, []byte(`"time":"`)); i >= 0 {
		if j := bytes.IndexByte(b[i+8:], '"'); j >= 0 {
			return append(b[:i:i], b[i+8+j:]...)
		}
	}
	return b
}

// deadLetter answers one dead letter whole: its headers and body (api.DeadLetter), what
// `meshnode dead show` prints.
func (d *Dashboard) deadLetter(w http.ResponseWriter, r *http.Request, _ *session) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "GET /ui/api/dead/<id>: the id is the letter's number in DEAD"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), stateTimeout)
	defer cancel()
	dead, err := d.cfg.JetStream.Stream(ctx, manifest.DeadStreamName)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	m, err := dead.GetMsg(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no dead letter %d (replayed or dropped?)", id)})
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusOK, deadletter.FromMsg(m))
	}
}

// ReplayAllReply answers POST /ui/api/dead-replay-all: the letters replayed, and each one
// refused with why (a letter its source could not have published is never replayed).
type ReplayAllReply struct {
	Replayed int               `json:"replayed"`
	Refused  map[uint64]string `json:"refused,omitempty"`
}

// deadReplayAll replays every dead letter (of one consumer, with ?consumer=), as `meshnode
// dead replay --all` does, each with the same checks as one.
func (d *Dashboard) deadReplayAll(w http.ResponseWriter, r *http.Request, s *session) {
	consumer := r.URL.Query().Get("consumer")
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	js := d.cfg.JetStream
	reply := ReplayAllReply{Refused: map[uint64]string{}}
	err := func() error {
		dead, err := js.Stream(ctx, manifest.DeadStreamName)
		if err != nil {
			return err
		}
		letters, err := deadletter.List(ctx, dead)
		if err != nil {
			return err
		}
		auth, err := deadletter.LoadAuthority(ctx, js, admin.List)
		if err != nil {
			return err
		}
		for _, l := range letters {
			if consumer != "" && l.Consumer != consumer {
				continue
			}
			m, err := dead.GetMsg(ctx, l.ID)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // replayed or dropped meanwhile
			}
			if err == nil {
				err = deadletter.Replay(ctx, js, dead, m, auth)
			}
			switch {
			case errors.Is(err, deadletter.ErrNotReplayable):
				reply.Refused[l.ID] = err.Error()
			case err != nil:
				return err
			default:
				reply.Replayed++
			}
		}
		return nil
	}()
	d.record(s, "dead-replay-all", cmp.Or(consumer, "every consumer"), fmt.Sprintf("%d replayed, %d refused", reply.Replayed, len(reply.Refused)), err)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf("replayed %d, then: %v", reply.Replayed, err)})
		return
	}
	writeJSON(w, http.StatusOK, reply)
}

// deadAction replays or drops a dead letter, as `meshnode dead replay|drop` does.
func (d *Dashboard) deadAction(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	action := r.PathValue("action")
	if err != nil || (action != "replay" && action != "drop") {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "POST /ui/api/dead/<id>/replay or /drop"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), stateTimeout)
	defer cancel()
	js := d.cfg.JetStream
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
	detail := ""
	if m != nil {
		detail = m.Subject // the letter's: which consumer's, and what event
	}
	d.record(s, "dead-"+action, strconv.FormatUint(id, 10), detail, err)
	if errors.Is(err, deadletter.ErrNotReplayable) {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	d.cfg.Log.Info("dead letter "+action+"ed from the dashboard", "id", id)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "action": action})
}
