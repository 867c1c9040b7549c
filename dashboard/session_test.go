package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/meshnode/meshnode/dashboard"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// consoleNode is a dashboard as a node opens it on its store, db: opened again on the same
// store, it is the node after a restart.
type consoleNode struct {
	t    *testing.T
	js   jetstream.JetStream // the bus of the node's last open
	db   *bolt.DB
	op   *reg
	srv  *httptest.Server
	acts []dashboard.ConsoleAction
}

// newConsoleNode opens a console on a fresh store, with a new operator key and its public key.
func newConsoleNode(t *testing.T) (*consoleNode, nkeys.KeyPair, string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meshnode.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	op, _ := nkeys.CreateOperator()
	pub, _ := op.PublicKey()
	c := &consoleNode{t: t, db: db, op: &reg{pub}}
	c.open()
	return c, op, pub
}

func (c *consoleNode) open() {
	c.t.Helper()
	if c.srv != nil {
		c.srv.Close()
	}
	nc, js := testbed.Connect(c.t, testbed.NATSServer(c.t, &server.Options{JetStream: true, StoreDir: c.t.TempDir()}))
	c.js = js
	d := dashboard.Open(context.Background(), dashboard.Config{Node: "alpha", MeshID: "mesh-1", Mesh: mesh{}, Registry: c.op,
		Audit: auditLog{}, Conn: nc, JetStream: js, Log: slog.New(slog.DiscardHandler), Sessions: dashboard.BoltSessions(c.db),
		Record: func(a dashboard.ConsoleAction) { c.acts = append(c.acts, a) }})
	c.t.Cleanup(func() { d.Close() })
	c.srv = httptest.NewServer(d.Handler())
	c.t.Cleanup(c.srv.Close)
}

// get is the status of GET path with browser's cookies.
func (c *consoleNode) get(browser *http.Client, path string) int {
	c.t.Helper()
	resp, err := browser.Get(c.srv.URL + path)
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// login logs a new browser in with key, as the operator's `meshnode ui` link does.
func (c *consoleNode) login(key nkeys.KeyPair) *http.Client {
	c.t.Helper()
	return logIn(c.t, c.srv.URL, key, false)
}

// logIn logs a new browser into the dashboard at base with key, read-only or not, through the
// signed one-time link `meshnode ui` prints.
func logIn(t *testing.T, base string, key nkeys.KeyPair, readOnly bool) *http.Client {
	t.Helper()
	link, err := dashboard.LoginLink(context.Background(), nil, base, key, readOnly, dashboard.Challenge{Node: "alpha", MeshID: "mesh-1"})
	if err != nil {
		t.Fatal(err)
	}
	browser := withCookies(nil)
	resp, err := browser.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %s, want a redirect to the pages", resp.Status)
	}
	return browser
}

// TestConsole_SessionsSurviveARestart: a session is a cookie the node signs with a key kept
// in its store, so the node opened again on that store still knows the browser; logged out,
// the cookie is refused, by this node and after a restart; a session of an operator key that
// was replaced is refused; and a forged or altered cookie is refused.
func TestConsole_SessionsSurviveARestart(t *testing.T) {
	c, op, _ := newConsoleNode(t)
	browser := c.login(op)
	if got := c.get(browser, "/ui/api/session"); got != http.StatusOK {
		t.Fatalf("logged in: GET /ui/api/session %d, want 200", got)
	}

	c.open() // the node restarts: its sessions' key is in its store
	if got := c.get(browser, "/ui/api/session"); got != http.StatusOK {
		t.Fatalf("after the node's restart: GET /ui/api/session %d, want 200 (the browser stays logged in)", got)
	}

	other := c.login(op)
	home, _ := url.Parse(c.srv.URL + "/ui/")
	saved := other.Jar.Cookies(home)
	req, _ := http.NewRequest(http.MethodPost, c.srv.URL+"/ui/logout", nil)
	resp, err := other.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("log out: %s, want 204", resp.Status)
	}
	// The browser forgets the cookie the node cleared; a copy of it (stolen, or kept) must
	// not work either, before or after a restart.
	copied := withCookies(home, saved...)
	if got := c.get(copied, "/ui/api/session"); got != http.StatusUnauthorized {
		t.Fatalf("a logged-out session's cookie: %d, want 401", got)
	}
	c.open()
	if got := c.get(copied, "/ui/api/session"); got != http.StatusUnauthorized {
		t.Fatalf("a logged-out session's cookie after a restart: %d, want 401", got)
	}
	if got := c.get(browser, "/ui/api/session"); got != http.StatusOK {
		t.Fatalf("another browser logged out: this one got %d, want 200", got)
	}

	// An altered cookie: its claims changed (read-only to operator, say) without the key.
	live := browser.Jar.Cookies(home)
	for _, ck := range live {
		altered := *ck
		b := []byte(altered.Value)
		b[5] ^= 1
		altered.Value = string(b)
		if got := c.get(withCookies(home, &altered), "/ui/api/session"); got != http.StatusUnauthorized {
			t.Fatalf("an altered session cookie: %d, want 401", got)
		}
	}

	newOp, _ := nkeys.CreateOperator()
	c.op.op, _ = newOp.PublicKey() // the operator's key changes: every session of the old one ends
	if got := c.get(browser, "/ui/api/session"); got != http.StatusUnauthorized {
		t.Fatalf("after the operator key changed: %d, want 401", got)
	}
}

// withCookies is a browser that follows no redirect, holding cookies for u (none for nil).
func withCookies(u *url.URL, cookies ...*http.Cookie) *http.Client {
	jar, _ := cookiejar.New(nil)
	if u != nil {
		jar.SetCookies(u, cookies)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// TestConsole_ActionsAreRecorded: an action taken in the console — here dropping a dead
// letter — is handed to the node's audit with the operator's key, what and on what.
func TestConsole_ActionsAreRecorded(t *testing.T) {
	c, op, pub := newConsoleNode(t)
	ctx := context.Background()
	if _, err := c.js.CreateStream(ctx, jetstream.StreamConfig{Name: manifest.DeadStreamName, Subjects: []string{"test.dead.shop"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := c.js.Publish(ctx, "test.dead.shop", []byte("a letter"))
	if err != nil {
		t.Fatal(err)
	}
	browser := c.login(op)
	resp, err := browser.Get(c.srv.URL + "/ui/api/session")
	if err != nil {
		t.Fatal(err)
	}
	var sess struct{ CSRF string }
	json.NewDecoder(resp.Body).Decode(&sess)
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/ui/api/dead/%d/drop", c.srv.URL, ack.Sequence), nil)
	req.Header.Set("X-CSRF-Token", sess.CSRF)
	resp, err = browser.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("drop dead letter %d: %s", ack.Sequence, resp.Status)
	}
	want := dashboard.ConsoleAction{Operator: pub, Action: "dead-drop", Target: fmt.Sprint(ack.Sequence), Detail: "test.dead.shop"}
	if len(c.acts) != 1 || c.acts[0] != want {
		t.Fatalf("recorded %+v, want %+v", c.acts, want)
	}
}

// TestConsole_AuditSearchRefusesBadInput: a search's bad parameter is refused naming it and
// what it takes; a good one answers a page.
func TestConsole_AuditSearchRefusesBadInput(t *testing.T) {
	c, op, _ := newConsoleNode(t)
	browser := c.login(op)
	for query, want := range map[string]int{
		"since=yesterday": http.StatusBadRequest, "before=-1": http.StatusBadRequest, "limit=0": http.StatusBadRequest,
		"since=2026-12-06T10:00:00Z&source=shop&not_genuine=1&limit=20": http.StatusOK,
	} {
		if got := c.get(browser, "/ui/api/audit?"+query); got != want {
			t.Errorf("GET /ui/api/audit?%s: %d, want %d", query, got, want)
		}
	}
}
