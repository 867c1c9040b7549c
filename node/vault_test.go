package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

func (b *bed) vault(verb string, req api.VaultRequest, out any) ([]api.VaultMeta, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return vault.Call(ctx, b.op, verb, api.VaultCallerOperator, req, out)
}

// assertNotStored fails t for each needle found in any message of any stream, or in any file
// of the node's JetStream store.
func (b *bed) assertNotStored(t *testing.T, needles map[string][]byte) {
	t.Helper()
	for i, m := range streamMessages(t, b.js) {
		for what, n := range needles {
			if bytes.Contains(m, n) {
				t.Errorf("stream message %d holds the %s: %.120q", i, what, m)
			}
		}
	}
	filepath.WalkDir(filepath.Join(b.dir, "jetstream"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, _ := os.ReadFile(path)
		for what, n := range needles {
			if bytes.Contains(data, n) {
				t.Errorf("store file %s holds the %s", path, what)
			}
		}
		return nil
	})
}

// streamMessages returns every message of every stream on the node.
func streamMessages(t *testing.T, js jetstream.JetStream) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out [][]byte
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		st := s.CachedInfo().State
		for seq := st.FirstSeq; seq <= st.LastSeq && st.Msgs > 0; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // deleted
			}
			hb, _ := json.Marshal(m.Header)
			out = append(out, append(append([]byte(m.Subject), hb...), m.Data...))
		}
	}
	return out
}

// TestVault_NoSecretInAnyStream mints, fetches and rotates secrets with known values, then
// scans every stream and the raw JetStream store: no plaintext and no sealed reply is there;
// the vault's records are ciphertext.
func TestVault_NoSecretInAnyStream(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: api\nrequires: [mesh-bus]\nsecrets: [db-password]\n")
	var minted, rotated api.Secret
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "api", Name: "db-password"}, &minted); err != nil {
		t.Fatal(err)
	}
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: api.VaultCallerOperator, Name: "smtp"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.vault(api.VaultVerbRotate, api.VaultRequest{Owner: "api", Name: "db-password"}, &rotated); err != nil {
		t.Fatal(err)
	}
	c := b.client(seed)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := c.Secret(ctx, "db-password")
	if err != nil {
		t.Fatal(err)
	}
	if got != rotated.Value || got == minted.Value {
		t.Fatalf("module fetched %q, want the rotated value", got)
	}
	// The previous version stays readable for the grace period.
	var prev api.Secret
	if _, err := b.vault(api.VaultVerbFetch, api.VaultRequest{Owner: "api", Name: "db-password", Version: 1}, &prev); err != nil || prev.Value != minted.Value {
		t.Fatalf("version 1 after rotation: %q, %v", prev.Value, err)
	}

	// A sealed reply, captured off the wire.
	raw, err := b.op.RequestWithContext(ctx, api.VaultToolSubject(api.VaultVerbFetch, api.VaultCallerOperator),
		mustJSON(api.VaultRequest{XKey: newXKey(t), Owner: "api", Name: "db-password"}))
	if err != nil {
		t.Fatal(err)
	}
	var reply api.VaultReply
	json.Unmarshal(raw.Data, &reply)
	if len(reply.Sealed) == 0 {
		t.Fatalf("fetch reply not sealed: %s", raw.Data)
	}

	needles := map[string][]byte{
		"minted value": []byte(minted.Value), "rotated value": []byte(rotated.Value),
		"sealed reply": reply.Sealed[8:40], "module seed": mustRead(t, seed),
	}
	b.assertNotStored(t, needles)
	// The vault's records are there, as ciphertext.
	kv, err := b.js.KeyValue(ctx, vault.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "secret.api.db-password")
	if err != nil || !bytes.Contains(e.Value(), []byte(`"cipher"`)) {
		t.Fatalf("vault record: %v %s", err, e.Value())
	}
	// Every action is an event with metadata, published after the answer.
	events, _ := b.js.Stream(ctx, manifest.EventsStreamName)
	retryUntil(t, 10*time.Second, func() error {
		for _, a := range []string{"minted", "rotated", "fetched", "identity-minted"} {
			if _, err := events.GetLastMsgForSubject(ctx, api.VaultEventSubject(a)); err != nil {
				return fmt.Errorf("no vault event %s: %v", a, err)
			}
		}
		return nil
	})
}

// TestVault_Authority: a module fetches only what its manifest names; it cannot ask as
// another module; a sealed reply opens only with the asker's xkey.
func TestVault_Authority(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nsecrets: [key-a]\n")
	b.register("module: bb\nrequires: [mesh-bus]\nsecrets: [key-b]\n")
	for _, r := range []api.VaultRequest{{Owner: "a", Name: "key-a"}, {Owner: "bb", Name: "key-b"}} {
		if _, err := b.vault(api.VaultVerbMint, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	ca := b.client(seedA)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ca.Secret(ctx, "key-a"); err != nil {
		t.Fatalf("own secret: %v", err)
	}
	if _, err := ca.Secret(ctx, "key-b"); !errors.Is(err, sdk.ErrNotDeclared) || !strings.Contains(err.Error(), "secrets:") {
		t.Fatalf("another module's secret, through the sdk: %v", err)
	}
	nc := b.raw(seedA, "a")
	// Past the sdk, the vault refuses it too.
	if _, err := vault.Call(ctx, nc, api.VaultVerbFetch, api.VaultModuleCaller("a"), api.VaultRequest{Name: "key-b"}, nil); !errors.Is(err, vault.ErrRefused) || !strings.Contains(err.Error(), "does not declare") {
		t.Fatalf("another module's secret, asked of the vault: %v", err)
	}
	for _, s := range []string{api.VaultToolSubject(api.VaultVerbFetch, api.VaultModuleCaller("bb")), api.VaultToolSubject(api.VaultVerbFetch, api.VaultCallerOperator),
		api.VaultToolSubject(api.VaultVerbMint, "a"), api.VaultToolSubject(api.VaultVerbIdentity, api.VaultCallerNode)} {
		if !refusedPub(t, nc, s) {
			t.Errorf("module a published on %s", s)
		}
	}
	// Only the asker's xkey opens the reply.
	asker, _ := nkeys.CreateCurveKeys()
	askerPub, _ := asker.PublicKey()
	msg, err := b.op.RequestWithContext(ctx, api.VaultToolSubject(api.VaultVerbFetch, api.VaultCallerOperator),
		mustJSON(api.VaultRequest{XKey: askerPub, Owner: "a", Name: "key-a"}))
	if err != nil {
		t.Fatal(err)
	}
	var reply api.VaultReply
	json.Unmarshal(msg.Data, &reply)
	other, _ := nkeys.CreateCurveKeys()
	if _, err := vault.Unseal(other, reply.Sender, reply.Sealed); err == nil {
		t.Fatal("another xkey opened the sealed reply")
	}
	if _, err := vault.Unseal(asker, reply.Sender, reply.Sealed); err != nil {
		t.Fatalf("the asker cannot open its reply: %v", err)
	}
}

// TestVault_GenesisAndRestart: genesis minted only the foundation, every later credential is
// a vault event, a second genesis is refused, and after a restart the vault unseals from the
// node's own store and serves the same secrets.
func TestVault_GenesisAndRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir, "alpha")
	b := newBedAt(t, cfg)
	b.register("module: a\nrequires: [mesh-bus]\nsecrets: [k]\n")
	b.register("module: c\nrequires: [mesh-bus]\n")
	var s api.Secret
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "a", Name: "k"}, &s); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Every identity minted after genesis is a vault event: the operator's and two modules'.
	// Events are published without waiting for the stream: poll until they are stored.
	events, _ := b.js.Stream(ctx, manifest.EventsStreamName)
	retryUntil(t, 10*time.Second, func() error {
		info, err := events.Info(ctx, jetstream.WithSubjectFilter(api.VaultEventSubject("identity-minted")))
		if err != nil {
			return err
		}
		if n := info.State.Subjects[api.VaultEventSubject("identity-minted")]; n != 3 {
			return fmt.Errorf("%d identity-minted events, want 3 (operator, a, c)", n)
		}
		return nil
	})
	b.close()

	// The store: genesis handed off and refuses to mint again.
	db, err := bolt.Open(filepath.Join(dir, "meshnode.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g := genesis.New(db)
	r, _ := g.Record()
	if r.HandedOff.IsZero() || len(r.Minted) != 7 {
		t.Fatalf("genesis record %+v", r)
	}
	if _, err := g.Begin("alpha", 1); !errors.Is(err, genesis.ErrHandedOff) {
		t.Fatalf("second genesis: %v, want ErrHandedOff", err)
	}
	db.Close()

	b = newBedAt(t, cfg)
	var again api.Secret
	if _, err := b.vault(api.VaultVerbFetch, api.VaultRequest{Owner: "a", Name: "k"}, &again); err != nil || again.Value != s.Value {
		t.Fatalf("after restart: %q, %v; want %q", again.Value, err, s.Value)
	}
}

// TestVault_JoinTokens: a token is single use, expires, and belongs to one mesh; each refusal
// says which; a join refused before the check completes does not consume it.
func TestVault_JoinTokens(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var tok api.Token
	if _, err := b.vault(api.VaultVerbToken, api.VaultRequest{TTL: "1h", Uses: 1}, &tok); err != nil {
		t.Fatal(err)
	}
	xkp, _ := nkeys.CreateCurveKeys()

	// A join whose request is bad (no xkey) is refused and leaves the token unused.
	bearer, _ := vault.ParseToken(tok.Token)
	kp, _ := nkeys.FromSeed([]byte(bearer.Seed))
	pub, _ := kp.PublicKey()
	nc := connect(t, b.n.ClientURL(), writeSeed(t, bearer.Seed), nats.CustomInboxPrefix("_INBOX."+pub))
	if _, err := vault.CallWith(ctx, nc, xkp, api.VaultVerbEnrol, bearer.ID, api.VaultRequest{Node: "beta"}, nil); err == nil {
		t.Fatal("an enrol without an xkey was accepted")
	}
	// The token's key may do nothing but enrol.
	for _, s := range []string{api.VaultToolSubject(api.VaultVerbFetch, api.VaultCallerOperator), "mesh.mod.x.event.y", "$JS.API.STREAM.LIST"} {
		if !refusedPub(t, nc, s) {
			t.Errorf("a join token published on %s", s)
		}
	}
	nc.Close()

	e, err := vault.Enrol(ctx, tok.Token, "beta", xkp)
	if err != nil {
		t.Fatalf("enrol: %v", err)
	}
	if e.MeshID != b.n.Identity().MeshID || len(e.BarrierKey) != 32 || len(e.GossipKey) != 32 {
		t.Fatalf("enrolment %+v", e)
	}
	if _, err := vault.Enrol(ctx, tok.Token, "gamma", xkp); err == nil || !strings.Contains(err.Error(), "used up") {
		t.Fatalf("second use: %v, want used up", err)
	}
	// A second node under a name that just enrolled is refused, and its token stays unused.
	var again api.Token
	if _, err := b.vault(api.VaultVerbToken, api.VaultRequest{TTL: "1h"}, &again); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 5*time.Second, func() error {
		_, err := vault.Enrol(ctx, again.Token, "beta", xkp)
		if err == nil || !strings.Contains(err.Error(), "may still be starting") {
			return fmt.Errorf("a second beta: %v", err)
		}
		return nil
	})
	if _, err := vault.Enrol(ctx, again.Token, "gamma", xkp); err != nil {
		t.Fatalf("the token refused for a taken name was spent: %v", err)
	}

	var short api.Token
	if _, err := b.vault(api.VaultVerbToken, api.VaultRequest{TTL: "1ms"}, &short); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 5*time.Second, func() error {
		_, err := vault.Enrol(ctx, short.Token, "delta", xkp)
		if err == nil || !strings.Contains(err.Error(), "expired") {
			return errors.New("not refused as expired yet: " + errString(err))
		}
		return nil
	})

	// A token of another mesh is refused at the door, naming the mesh it is for.
	other := newBed(t)
	var foreign api.Token
	if _, err := other.vault(api.VaultVerbToken, api.VaultRequest{}, &foreign); err != nil {
		t.Fatal(err)
	}
	fb, _ := vault.ParseToken(foreign.Token)
	fb.Addrs = []string{b.n.ClientURL()}
	if _, err := vault.Enrol(ctx, fb.String(), "eps", xkp); err == nil || !strings.Contains(err.Error(), "not a token of the mesh there") || !strings.Contains(err.Error(), other.n.Identity().MeshID) {
		t.Fatalf("foreign token: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

func newXKey(t *testing.T) string {
	kp, _ := nkeys.CreateCurveKeys()
	pub, _ := kp.PublicKey()
	return pub
}

func writeSeed(t *testing.T, seed string) string {
	path := filepath.Join(t.TempDir(), "token.nk")
	os.WriteFile(path, []byte(seed), 0o600)
	return path
}

// TestVault_ServerCredentials: the vault's own credentials go only to a server of the mesh,
// sealed to that server's recorded xkey — not to the operator, not to another key.
func TestVault_ServerCredentials(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	var out api.ServerSecrets
	if _, err := b.vault(api.VaultVerbServer, api.VaultRequest{Node: "alpha"}, &out); !errors.Is(err, vault.ErrRefused) {
		t.Fatalf("the operator asked for the barrier key: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := vault.Call(ctx, b.op, api.VaultVerbServer, api.VaultCallerNode, api.VaultRequest{Node: "alpha"}, &out); !errors.Is(err, vault.ErrRefused) || !strings.Contains(err.Error(), "recorded xkey") {
		t.Fatalf("a key that is not the server's asked for the barrier key: %v", err)
	}
}

// TestVault_FetchesCounted: a module fetching in a loop gets every fetch recorded, but as
// at most one "fetched" event a second per secret version, with a count: the first at once,
// the rest counted.
func TestVault_FetchesCounted(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: looper\nrequires: [mesh-bus]\nsecrets: [key]\n")
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "looper", Name: "key"}, nil); err != nil {
		t.Fatal(err)
	}
	c := b.client(seed)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const fetches = 30
	start := time.Now()
	for range fetches {
		if _, err := c.Secret(ctx, "key"); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	events, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	var counts []int
	retryUntil(t, 10*time.Second, func() error {
		counts = nil
		total := 0
		var seq uint64
		for {
			m, err := events.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(api.VaultEventSubject("fetched")))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return err
			}
			seq = m.Sequence
			var meta struct {
				Owner string `json:"owner"`
				Count int    `json:"count"`
			}
			if err := json.Unmarshal(m.Data, &meta); err != nil || meta.Owner != "looper" {
				t.Fatalf("fetched event %d: %s %v", seq, m.Data, err)
			}
			counts = append(counts, max(meta.Count, 1))
			total += max(meta.Count, 1)
		}
		if total != fetches {
			return fmt.Errorf("fetched events count %d fetches (%v), want %d", total, counts, fetches)
		}
		return nil
	})
	// The first, then one a second of the fetches' span (under -race the 30 take seconds),
	// and one for the last second's.
	if most := 2 + int(took/time.Second); counts[0] != 1 || len(counts) > most {
		t.Fatalf("fetched events with counts %v in %s: want the first alone, then at most one a second (%d events)", counts, took, most)
	}
}
