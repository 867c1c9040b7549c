//go:build integration

package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// register registers a manifest with the CLI and returns the seed file.
// registerModule registers text through the node on dir (with extra flags, such as --creds)
// and returns the new module's seed file.
func registerModule(t *testing.T, dir, text string, extra ...string) string {
	t.Helper()
	work := t.TempDir()
	path := filepath.Join(work, "m.yaml")
	os.WriteFile(path, []byte(text), 0o600)
	seed := filepath.Join(work, "m.nk")
	if r := meshnode(t, nil, append([]string{"module", "register", path, "--creds-out", seed, "--data-dir", dir}, extra...)...); r.code != 0 {
		t.Fatalf("register: exit %d %s", r.code, r.stderr)
	}
	return seed
}

func nodeStatus(t *testing.T, dir string) (records, lag uint64, err error) {
	r := meshnode(t, nil, "status", "--json", "--data-dir", dir)
	if r.code != 0 {
		return 0, 0, errors.New(r.stderr)
	}
	var st struct {
		Audit struct{ Records, Lag uint64 } `json:"audit"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		return 0, 0, err
	}
	return st.Audit.Records, st.Audit.Lag, nil
}

// TestIntegration_Binary_AuditSurvivesKill9: the node is killed with SIGKILL while it ingests; after a
// restart the audit log holds every event the bus acknowledged, each once, and verifies.
func TestIntegration_Binary_AuditSurvivesKill9(t *testing.T) {
	dir := t.TempDir()
	// The publisher below goes as fast as a raw client goes and does not retry a refusal:
	// with a pace, its refusals would bar it for flooding, and past flood-rate its rate
	// would. Neither is what this tests.
	p := startNode(t, "up", append(upArgs(dir, "alpha"), "--emit-rate", "0", "--flood-rate", "0")...)
	seed := registerModule(t, dir, "module: m\nrequires: [mesh-bus]\nemits: [tick]\n")

	raw, _ := os.ReadFile(seed)
	kp, _ := nkeys.ParseDecoratedNKey(raw)
	pub, _ := kp.PublicKey()
	sk, _ := envelope.NewSigningKey(kp)
	nc, err := nats.Connect(p.clientURL, nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix("_INBOX.m"),
		nats.MaxReconnects(0), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	subject := manifest.EventSubject("m", "tick")

	var mu sync.Mutex
	acked := map[string]bool{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			body := []byte(fmt.Sprintf(`{"i":%d}`, i))
			h, _ := envelope.Stamp(sk, "m", "alpha", subject, body, envelope.Options{})
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: manifest.AdmitSubject("m", subject), Header: h, Data: body})
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				// The window of 256 is full and no ack came in 200 ms (a busy machine): wait
				// for room rather than give up, so the node still gets its few thousand.
				continue
			}
			if err != nil {
				return
			}
			id := h.Get(envelope.EventID)
			go func() {
				select {
				case <-f.Ok():
					mu.Lock()
					acked[id] = true
					mu.Unlock()
				case <-f.Err():
				}
			}()
		}
	}()
	// Kill it mid-ingest: once the log has a few thousand records, and while the publisher
	// still publishes. Behind the bus is the harder case, so wait up to 15 s to catch the log
	// with a lag; since the log verifies in batches it often keeps up on an idle machine, and
	// then events are still in flight between the bus and the log when the kill lands.
	retryUntil(t, 60*time.Second, func() error {
		records, _, err := nodeStatus(t, dir)
		if err != nil {
			return err
		}
		if records < 2000 {
			return fmt.Errorf("records %d", records)
		}
		return nil
	})
	behind := false
	for deadline := time.Now().Add(15 * time.Second); !behind && time.Now().Before(deadline); {
		_, lag, err := nodeStatus(t, dir)
		behind = err == nil && lag > 0
	}
	t.Logf("killed with the log behind the bus: %v", behind)
	p.stop(t, syscall.SIGKILL)
	close(stop)
	<-done
	nc.Close()
	mu.Lock()
	nAcked := len(acked)
	mu.Unlock()

	startNode(t, "up", upArgs(dir, "alpha")...)
	retryUntil(t, 60*time.Second, func() error {
		_, lag, err := nodeStatus(t, dir)
		if err != nil {
			return err
		}
		if lag != 0 {
			return fmt.Errorf("lag %d", lag)
		}
		return nil
	})
	recorded := auditIDs(t, dir, filepath.Join(dir, "operator.nk"), "m")
	for id, n := range recorded {
		if n != 1 {
			t.Fatalf("event %s recorded %d times", id, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id := range acked {
		if recorded[id] != 1 {
			t.Fatalf("event %s was acknowledged by the bus but is not in the audit log (%d acked, %d recorded)", id, nAcked, len(recorded))
		}
	}
	t.Logf("%d events acknowledged before the kill, %d recorded after the restart", nAcked, len(recorded))
	if r := meshnode(t, nil, "audit", "verify", "--data-dir", dir); r.code != 0 {
		t.Fatalf("audit verify: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
}

// TestIntegration_Binary_DeadLetterReplay: a consumer that always fails sends the event to DEAD after
// MaxDeliver attempts with the reason and count; replay delivers it again, and a fixed
// consumer handles it once.
func TestIntegration_Binary_DeadLetterReplay(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	pSeed := registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	cSeed := registerModule(t, dir, "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	broken, err := sdk.Connect(ctx, p.clientURL, cSeed, sdk.WithRetryBackoff(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := broken.On("shop.order.placed", func(context.Context, sdk.Event) error { return errors.New("no such customer") }); err != nil {
		t.Fatal(err)
	}
	if r := meshnode(t, nil, "emit", "order.placed", `{"order":7}`, "--creds", pSeed, "--data-dir", dir); r.code != 0 {
		t.Fatalf("emit: %s", r.stderr)
	}
	var dl struct {
		ID         uint64 `json:"id"`
		Reason     string `json:"reason"`
		Deliveries int    `json:"deliveries"`
		EventID    string `json:"event_id"`
		Consumer   string `json:"consumer"`
	}
	retryUntil(t, 20*time.Second, func() error {
		r := meshnode(t, nil, "dead", "ls", "--json", "--data-dir", dir)
		if r.code != 0 || strings.TrimSpace(r.stdout) == "" {
			return fmt.Errorf("no dead letter yet: %s", r.stderr)
		}
		return json.Unmarshal([]byte(strings.Split(strings.TrimSpace(r.stdout), "\n")[0]), &dl)
	})
	if dl.Reason != "no such customer" || dl.Deliveries != manifest.MaxDeliver || dl.Consumer != "billing" {
		t.Fatalf("dead letter %+v", dl)
	}
	if r := meshnode(t, nil, "dead", "show", fmt.Sprint(dl.ID), "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, `"order": 7`) {
		t.Fatalf("dead show: exit %d %s", r.code, r.stdout)
	}
	broken.Close()

	// The fixed consumer handles the replayed event once, under its original id.
	var mu sync.Mutex
	var got []string
	fixed, err := sdk.Connect(ctx, p.clientURL, cSeed)
	if err != nil {
		t.Fatal(err)
	}
	defer fixed.Close()
	if err := fixed.On("shop.order.placed", func(_ context.Context, e sdk.Event) error {
		mu.Lock()
		got = append(got, e.ID)
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := meshnode(t, nil, "dead", "replay", fmt.Sprint(dl.ID), "--data-dir", dir); r.code != 0 {
		t.Fatalf("dead replay: exit %d %s", r.code, r.stderr)
	}
	retryUntil(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 {
			return errors.New("the replayed event has not arrived")
		}
		return nil
	})
	if r := meshnode(t, nil, "dead", "ls", "--json", "--data-dir", dir); strings.TrimSpace(r.stdout) != "" {
		t.Fatalf("dead letter still listed after replay: %s", r.stdout)
	}
	if r := meshnode(t, nil, "dead", "replay", fmt.Sprint(dl.ID), "--data-dir", dir); r.code != 1 || !strings.Contains(r.stderr, "dead ls") {
		t.Fatalf("replaying twice: exit %d %s", r.code, r.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != dl.EventID {
		t.Fatalf("fixed consumer got %v, want once %s", got, dl.EventID)
	}
}

// TestIntegration_Binary_AuditVerifyListsForgeries: a log holding forged events is intact, so verify exits
// 0, and lists every event that is not genuine with its kind, as a table and as JSON.
func TestIntegration_Binary_AuditVerifyListsForgeries(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	shopSeed := registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	billingSeed := registerModule(t, dir, "module: billing\nrequires: [mesh-bus]\nemits: [order.billed]\n")
	op, err := dialWith(p.clientURL, filepath.Join(dir, datadir.OperatorSeedFile))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	subject := manifest.EventSubject("shop", "order.placed")
	body := []byte(`{"order":1}`)
	// Billing's genuine signature, on shop's subject; and shop's, under an id that is no UUID.
	mislabelled, _ := envelope.Stamp(mustSeed(t, billingSeed), "billing", "alpha", subject, body, envelope.Options{})
	badID := nats.Header{}
	for k, v := range mislabelled {
		badID[k] = v
	}
	badID.Set(envelope.EventID, "order-1")
	badID.Set(envelope.Source, "shop")
	in := envelope.SigningInput("order-1", badID.Get(envelope.Time), subject, "shop", body)
	sig, _ := mustSeed(t, shopSeed).Sign(in)
	badID.Set(envelope.Signature, base64.RawURLEncoding.EncodeToString(sig))
	badID.Set(nats.MsgIdHdr, "order-1")
	for _, h := range []nats.Header{mislabelled, badID} {
		if err := op.PublishMsg(&nats.Msg{Subject: subject, Header: h, Data: body}); err != nil {
			t.Fatal(err)
		}
	}
	var v api.AuditVerification
	retryUntil(t, 20*time.Second, func() error {
		r := meshnode(t, nil, "audit", "verify", "--json", "--data-dir", dir)
		if r.code != 0 {
			return fmt.Errorf("exit %d: %s", r.code, r.stderr)
		}
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			return err
		}
		if v.FlaggedTotal < 2 {
			return fmt.Errorf("%d flagged: %s", v.FlaggedTotal, r.stdout)
		}
		return nil
	})
	kinds := map[string]bool{}
	for _, f := range v.Flagged {
		kinds[f.Kind] = true
	}
	if v.Broken != nil || v.FlaggedTotal != 2 || !kinds[api.AuditFlagSourceMismatch] || !kinds[api.AuditFlagBadID] {
		t.Errorf("verify --json: %+v", v)
	}
	r := meshnode(t, nil, "audit", "verify", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "audit log intact") || !strings.Contains(r.stdout, "2 not genuine") ||
		!strings.Contains(r.stdout, api.AuditFlagSourceMismatch) || !strings.Contains(r.stdout, "order-1") {
		t.Errorf("verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
