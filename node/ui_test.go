package node_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/dashboard"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nkeys"
)

// operatorKey reads the bed's operator seed.
func operatorKey(t testing.TB, dir string) nkeys.KeyPair {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, datadir.OperatorSeedFile))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.ParseDecoratedNKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// browser is an HTTP client with a cookie jar that does not follow redirects.
func browser(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, method, url string, header http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// uiLogin logs a browser into b's node's dashboard, operator or read-only, checking the link
// is good once; it returns the browser and its session's CSRF token.
func uiLogin(t *testing.T, b *bed, readOnly bool) (*http.Client, string) {
	t.Helper()
	base := b.n.HTTPURL()
	link, err := dashboard.LoginLink(context.Background(), nil, base, operatorKey(t, b.dir), readOnly, dashboard.Challenge{Node: "alpha", MeshID: b.n.Identity().MeshID})
	if err != nil {
		t.Fatal(err)
	}
	c := browser(t)
	if code, _ := do(t, c, "GET", link, nil); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	if code, _ := do(t, c, "GET", link, nil); code != http.StatusForbidden {
		t.Fatalf("the same link again: %d, want refused", code)
	}
	code, body := do(t, c, "GET", base+"/ui/api/session", nil)
	var s struct{ Mode, CSRF, Node string }
	if json.Unmarshal([]byte(body), &s); code != 200 || s.CSRF == "" || s.Node != "alpha" {
		t.Fatalf("session: %d %s", code, body)
	}
	return c, s.CSRF
}

// TestUI_Deploy: an operator session deploys a module's artifact from the dashboard and sees
// it run, then undeploys it; the controller's refusal reaches the page; a read-only session,
// or a request without the CSRF token, may not deploy.
func TestUI_Deploy(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	base := b.n.HTTPURL()
	b.register("module: ticker\nrequires: [mesh-bus]\n")
	b.putArtifact("ticker", "1", fmt.Sprintf(sleeper, "1"))
	post := func(c *http.Client, csrf, path, body string) (int, string) {
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if csrf != "" {
			req.Header.Set("X-Csrf-Token", csrf)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	ro, roCSRF := uiLogin(t, b, true)
	if code, body := post(ro, roCSRF, "/ui/api/deploy", `{"module":"ticker","version":"1"}`); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Fatalf("a read-only session's deploy: %d %s", code, body)
	}
	op, csrf := uiLogin(t, b, false)
	if code, _ := post(op, "", "/ui/api/deploy", `{"module":"ticker","version":"1"}`); code != http.StatusForbidden {
		t.Fatalf("a deploy without the CSRF token: %d, want refused", code)
	}
	if code, body := post(op, csrf, "/ui/api/deploy", `{"module":"ticker"}`); code != http.StatusBadRequest || !strings.Contains(body, "version are required") {
		t.Fatalf("a deploy without a version: %d %s", code, body)
	}
	if code, body := post(op, csrf, "/ui/api/deploy", `{"module":"ticker","version":"9"}`); code != http.StatusConflict || !strings.Contains(body, "9") {
		t.Fatalf("a deploy of a version never stored: %d %s, want the controller's refusal", code, body)
	}
	// A deployment with an environment, as the CLI makes one.
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	if _, err := admin.Deploy(dctx, b.op, api.DeployRequest{Module: "ticker",
		Deployment: api.Deployment{Version: "1", Nodes: []string{"alpha"}, Instances: 1, Env: map[string]string{"GREETING": "hi"}}}); err != nil {
		t.Fatal(err)
	}
	code, body := post(op, csrf, "/ui/api/deploy", `{"module":"ticker","version":"1","instances":2}`)
	var reply api.DeployReply
	if json.Unmarshal([]byte(body), &reply); code != 200 || reply.Deployment == nil || reply.Deployment.Env["GREETING"] != "hi" || reply.Deployment.Instances != 2 {
		t.Fatalf("deploy, keeping the CLI's environment: %d %s", code, body)
	}
	running := func(want int) func() error {
		return func() error {
			_, body := do(t, op, "GET", base+"/ui/api/state", nil)
			var st dashboard.State
			if err := json.Unmarshal([]byte(body), &st); err != nil {
				return err
			}
			n := 0
			for _, p := range st.Processes {
				if p.Module == "ticker" && p.State == host.StateRunning {
					n++
				}
			}
			if n != want {
				return fmt.Errorf("the dashboard shows %d ticker processes running, want %d: %+v", n, want, st.Processes)
			}
			return nil
		}
	}
	retryUntil(t, 20*time.Second, running(2))
	if code, body := post(op, csrf, "/ui/api/undeploy", `{"module":"ticker"}`); code != 200 {
		t.Fatalf("undeploy: %d %s", code, body)
	}
	retryUntil(t, 20*time.Second, running(0))
}

// TestUI_Access: the dashboard's pages are served to anyone, its data only to a session. A
// login link is good once, only with the operator's signature over this mesh, this nonce and
// this mode; a read-only session may not act; an operator's action needs the session's CSRF
// token and no foreign Origin. A session's event stream pushes the snapshot.
func TestUI_Access(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	base := b.n.HTTPURL()
	ctx := context.Background()
	key := operatorKey(t, b.dir)
	anon := browser(t)
	if code, body := do(t, anon, "GET", base+"/ui/", nil); code != 200 || !strings.Contains(body, "<title>meshnode</title>") {
		t.Fatalf("GET /ui/: %d %.80s", code, body)
	}
	if code, _ := do(t, anon, "GET", base+"/", nil); code != http.StatusFound {
		t.Fatalf("GET /: %d, want a redirect to /ui/", code)
	}
	for _, path := range []string{"/ui/api/state", "/ui/api/session", "/ui/api/events"} {
		if code, body := do(t, anon, "GET", base+path, nil); code != http.StatusUnauthorized || !strings.Contains(body, "meshnode ui") {
			t.Fatalf("GET %s without a session: %d %s", path, code, body)
		}
	}

	// A challenge from another node than the one meant is not signed.
	if _, err := dashboard.LoginLink(ctx, nil, base, key, false, dashboard.Challenge{Node: "beta"}); err == nil || !strings.Contains(err.Error(), "nothing signed") {
		t.Fatalf("a challenge of node alpha signed for beta: %v", err)
	}
	// Links that must not log in: another key's signature, a changed mode, a spent nonce.
	module, _ := nkeys.CreateUser()
	forged, err := dashboard.LoginLink(ctx, nil, base, module, false, dashboard.Challenge{})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := do(t, anon, "GET", forged, nil); code != http.StatusForbidden || !strings.Contains(body, "not signed by the mesh's operator") {
		t.Fatalf("a link signed by another key: %d %s", code, body)
	}
	readOnly, err := dashboard.LoginLink(ctx, nil, base, key, true, dashboard.Challenge{})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := do(t, anon, "GET", strings.Replace(readOnly, "mode=read-only", "mode=operator", 1), nil); code != http.StatusForbidden {
		t.Fatalf("a read-only link turned operator: %d", code)
	}
	if code, _ := do(t, anon, "GET", readOnly, nil); code != http.StatusForbidden {
		t.Fatalf("a link whose nonce a refused login spent: %d", code)
	}

	login := func(readOnly bool) (*http.Client, string) { return uiLogin(t, b, readOnly) }
	ro, roCSRF := login(true)
	code, body := do(t, ro, "GET", base+"/ui/api/state", nil)
	var st dashboard.State
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || len(st.Members) != 1 || st.Members[0].Name != "alpha" || len(st.Seats) == 0 {
		t.Fatalf("state: %d %v %.300s", code, err, body)
	}
	// Each key once: the modules and edges are spliced into the encoded state.
	dec := json.NewDecoder(strings.NewReader(body))
	dec.Token() // {
	keys := map[string]int{}
	for dec.More() {
		k, _ := dec.Token()
		keys[fmt.Sprint(k)]++
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("state: %v", err)
		}
	}
	for _, k := range []string{"node", "members", "seats", "modules", "edges", "streams", "audit", "dead"} {
		if keys[k] != 1 {
			t.Errorf("the state has %q %d times, want once: %v", k, keys[k], keys)
		}
	}
	if code, body := do(t, ro, "POST", base+"/ui/api/dead/1/replay", http.Header{"X-Csrf-Token": {roCSRF}}); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Fatalf("a read-only session's replay: %d %s", code, body)
	}
	opc, csrf := login(false)
	for _, h := range []http.Header{nil, {"X-Csrf-Token": {"wrong"}}, {"X-Csrf-Token": {csrf}, "Origin": {"http://evil.example"}}} {
		if code, _ := do(t, opc, "POST", base+"/ui/api/dead/1/replay", h); code != http.StatusForbidden {
			t.Fatalf("an action with headers %v: %d, want refused", h, code)
		}
	}
	u, _ := url.Parse(base)
	if code, body := do(t, opc, "POST", base+"/ui/api/dead/1/replay", http.Header{"X-Csrf-Token": {csrf}, "Origin": {"http://" + u.Host}}); code != http.StatusNotFound || !strings.Contains(body, "no dead letter 1") {
		t.Fatalf("an operator's replay of a letter that does not exist: %d %s", code, body)
	}

	// The event stream pushes the snapshot, and a module registered later shows in it.
	req, _ := http.NewRequest("GET", base+"/ui/api/events", nil)
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	resp, err := opc.Do(req.WithContext(sctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b.register("module: later\nrequires: [mesh-bus]\nemits: [x]\n")
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		data, ok := strings.CutPrefix(lines.Text(), "data: ")
		if !ok {
			continue
		}
		var st dashboard.State
		if err := json.Unmarshal([]byte(data), &st); err != nil {
			t.Fatalf("event data: %v", err)
		}
		for _, m := range st.Modules {
			if m.Module == "later" {
				return
			}
		}
	}
	t.Fatalf("the event stream ended without the module registered later: %v", lines.Err())
}

// uiHolderEnv, when set ("URL SEED"), makes the test binary a module process for the
// dashboard's browser bed: a candidate for its seat's "send" jobs that prints its instance
// name and runs until killed.
const uiHolderEnv = "MESHNODE_TEST_UI_HOLDER"

func uiHolder() {
	args := strings.Fields(os.Getenv(uiHolderEnv))
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "ui holder: want URL SEED")
		os.Exit(2)
	}
	c, err := sdk.Connect(context.Background(), args[0], args[1])
	if err == nil {
		err = c.Accept("send", func(context.Context, sdk.Job) error { return nil })
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ui holder:", err)
		os.Exit(1)
	}
	fmt.Println(c.Instance())
	select {}
}

// TestUI_ReplayJob: the dashboard replays a seat's dead job back into the seat's work queue
// (the node's own connection may publish there; the CLI's replay is the operator's), and the
// holder handles it.
func TestUI_ReplayJob(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedW, _ := b.register("module: worker\nrequires: [mesh-bus]\nseats:\n  jobs: {scope: mesh, retain: 1h, accepts: [run]}\n")
	seedS, _ := b.register("module: shop\nrequires: [mesh-bus]\nuses: [jobs]\n")
	var fixed, handled atomic.Bool
	w := b.client(seedW, sdk.WithRetryBackoff(10*time.Millisecond))
	if err := w.Accept("run", func(context.Context, sdk.Job) error {
		if !fixed.Load() {
			return errors.New("printer on fire")
		}
		handled.Store(true)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	holder(t, "jobs", w)
	submit(t, b.client(seedS), "jobs", "run", 1)
	letters := awaitDead(t, b, manifest.DeadSubject(manifest.SeatStreamName("jobs"), manifest.SeatConsumerName("jobs", manifest.ScopeMesh, "")), 1, nil)
	fixed.Store(true)

	op, csrf := uiLogin(t, b, false)
	u, _ := url.Parse(b.n.HTTPURL())
	path := fmt.Sprintf("%s/ui/api/dead/%d/replay", b.n.HTTPURL(), letters[0].Sequence)
	if code, body := do(t, op, "POST", path, http.Header{"X-Csrf-Token": {csrf}, "Origin": {"http://" + u.Host}}); code != http.StatusOK {
		t.Fatalf("the dashboard's replay of a dead job: %d %s", code, body)
	}
	retryUntil(t, 10*time.Second, func() error {
		if !handled.Load() {
			return errors.New("the replayed job has not been handled")
		}
		return nil
	})
}

// TestUI_DeadLettersReadAndReplayedAll: the console reads a dead letter whole (its headers
// and body), replays every letter of a consumer at once, and each action lands in the
// audit log as the node event console-action with the operator's key.
func TestUI_DeadLettersReadAndReplayedAll(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedW, _ := b.register("module: worker\nrequires: [mesh-bus]\nseats:\n  jobs: {scope: mesh, retain: 1h, accepts: [run]}\n")
	seedS, _ := b.register("module: shop\nrequires: [mesh-bus]\nuses: [jobs]\n")
	var fixed atomic.Bool
	var handled atomic.Int32
	w := b.client(seedW, sdk.WithRetryBackoff(10*time.Millisecond))
	if err := w.Accept("run", func(context.Context, sdk.Job) error {
		if !fixed.Load() {
			return errors.New("printer on fire")
		}
		handled.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	holder(t, "jobs", w)
	submit(t, b.client(seedS), "jobs", "run", 2)
	consumer := manifest.SeatConsumerName("jobs", manifest.ScopeMesh, "")
	letters := awaitDead(t, b, manifest.DeadSubject(manifest.SeatStreamName("jobs"), consumer), 2, nil)
	fixed.Store(true)

	op, csrf := uiLogin(t, b, false)
	u, _ := url.Parse(b.n.HTTPURL())
	code, body := do(t, op, "GET", fmt.Sprintf("%s/ui/api/dead/%d", b.n.HTTPURL(), letters[0].Sequence), nil)
	var letter api.DeadLetter
	if code != http.StatusOK || json.Unmarshal([]byte(body), &letter) != nil {
		t.Fatalf("GET a dead letter: %d %s", code, body)
	}
	if letter.Consumer != consumer || !strings.Contains(string(letter.Body), `"job"`) || len(letter.Headers[envelope.EventID]) != 1 {
		t.Errorf("the dead letter as the console reads it: consumer %q, body %q, headers %v; want the job whole", letter.Consumer, letter.Body, letter.Headers)
	}
	if code, _ := do(t, op, "GET", b.n.HTTPURL()+"/ui/api/dead/999999", nil); code != http.StatusNotFound {
		t.Errorf("GET a dead letter that is not there: %d, want 404", code)
	}

	code, body = do(t, op, "POST", b.n.HTTPURL()+"/ui/api/dead-replay-all?consumer="+url.QueryEscape(consumer),
		http.Header{"X-Csrf-Token": {csrf}, "Origin": {"http://" + u.Host}})
	var reply dashboard.ReplayAllReply
	if code != http.StatusOK || json.Unmarshal([]byte(body), &reply) != nil || reply.Replayed != 2 || len(reply.Refused) != 0 {
		t.Fatalf("replay every letter of %s: %d %s, want 2 replayed", consumer, code, body)
	}
	retryUntil(t, 10*time.Second, func() error {
		if n := handled.Load(); n != 2 {
			return fmt.Errorf("%d of the 2 replayed jobs handled", n)
		}
		return nil
	})
	opKey, _ := operatorKey(t, b.dir).PublicKey()
	retryUntil(t, 10*time.Second, func() error {
		recs := b.audit(api.AuditRequest{Op: "query", Filter: api.AuditFilter{Event: "node.*.console-action"}}).Records
		if len(recs) != 1 || recs[0].NotGenuine != "" {
			return fmt.Errorf("the audit log's console actions: %+v, want the replay, genuine", recs)
		}
		var a dashboard.ConsoleAction
		json.Unmarshal(recs[0].Body, &a)
		if a.Operator != opKey || a.Action != "dead-replay-all" || a.Target != consumer || a.Detail != "2 replayed, 0 refused" {
			return fmt.Errorf("the audited action %+v, want the operator %s replaying all of %s", a, opKey, consumer)
		}
		return nil
	})
}

// TestUI_ModulePage: a module's page in the console holds what an operator looks for: its
// manifest as registered, the permissions derived from it, who it talks to (both ways),
// its durable consumer and lag, the events it emitted, its use of EVENTS; a module not
// registered is a 404 that says where to look.
func TestUI_ModulePage(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	shopSeed, _ := b.register("module: shop\nrequires: [mesh-bus]\nemits: [order]\n")
	sinkSeed, _ := b.register("module: sink\nrequires: [mesh-bus]\nconsumes: [shop.order]\n")
	sink := b.client(sinkSeed)
	if err := sink.On("shop.order", func(context.Context, sdk.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := b.client(shopSeed).Emit(ctx, "order", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	op, _ := uiLogin(t, b, true)
	page := func(name string) (dashboard.ModulePage, int) {
		code, body := do(t, op, "GET", b.n.HTTPURL()+"/ui/api/modules/"+name, nil)
		var p dashboard.ModulePage
		if code == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatalf("GET the page of %s: %v %s", name, err, body)
			}
		}
		return p, code
	}
	retryUntil(t, 20*time.Second, func() error {
		p, code := page("shop")
		if code != http.StatusOK {
			return fmt.Errorf("GET shop's page: %d", code)
		}
		emits := slices.ContainsFunc(p.Permissions.Publish, func(s string) bool { return strings.HasSuffix(s, manifest.EventSubject("shop", "order")) })
		if !strings.Contains(p.Manifest, "emits: [order]") || !emits {
			return fmt.Errorf("shop's manifest %q and permissions %v: want its YAML, and its event's subject (through admission) to publish", p.Manifest, p.Permissions.Publish)
		}
		if len(p.Talks) != 1 || p.Talks[0] != (dashboard.Edge{From: "shop", To: "sink", Kind: "events", What: "order"}) {
			return fmt.Errorf("who shop talks to: %+v, want its events to sink", p.Talks)
		}
		if len(p.Events) != 1 || p.Events[0].Event != "shop.order" || p.Events[0].Check != "ok" {
			return fmt.Errorf("shop's events: %+v, want %s, genuine", p.Events, id)
		}
		if p.Quota == nil || p.Quota.Held == 0 {
			return fmt.Errorf("shop's quota use %+v, want its event's bytes held", p.Quota)
		}
		if p.Logs.Hint == "" || len(p.Errors) != 0 {
			return fmt.Errorf("shop's page: logs %+v (want why none: deployed nowhere), errors %v", p.Logs, p.Errors)
		}
		return nil
	})
	retryUntil(t, 20*time.Second, func() error {
		p, _ := page("sink")
		if len(p.Consumers) != 1 || p.Consumers[0].Stream != manifest.EventsStreamName || p.Consumers[0].Name != "sink" || p.Consumers[0].Pending != 0 {
			return fmt.Errorf("sink's consumers: %+v, want its EVENTS consumer with nothing pending", p.Consumers)
		}
		if len(p.Talks) != 1 || p.Talks[0].From != "shop" {
			return fmt.Errorf("who talks to sink: %+v, want shop", p.Talks)
		}
		return nil
	})
	if _, code := page("nobody"); code != http.StatusNotFound {
		t.Errorf("the page of a module not registered: %d, want 404", code)
	}
}
