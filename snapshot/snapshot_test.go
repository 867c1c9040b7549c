package snapshot_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/snapshot"
	"github.com/meshnode/meshnode/streammove"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// secret is a vault record's plaintext: the file holds it only sealed.
const secret = "smtp-password-correct-horse-battery-staple"

// mesh is a JetStream server holding streams like a mesh's.
type mesh struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	seed []byte // a module's seed, kept sealed in the vault bucket
}

// mustMesh starts a JetStream server with streams shaped like the mesh's: the registry (a
// KV bucket with revisions), the vault (sealed records), a seat's work queue with a
// durable consumer past two jobs, EVENTS with an audit consumer, the artifacts (an object
// store), and a stream that is not the mesh's.
func mustMesh(t *testing.T) *mesh {
	t.Helper()
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	nc, js := testbed.Connect(t, srv)
	ctx := testContext(t)
	m := &mesh{nc: nc, js: js}

	reg, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "mesh-registry", History: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v1", "v2", "v3"} {
		if _, err := reg.Put(ctx, "modules.shop", []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.Put(ctx, "modules.mailer", []byte("m1")); err != nil {
		t.Fatal(err)
	}

	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	if m.seed, err = kp.Seed(); err != nil {
		t.Fatal(err)
	}
	vkv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "mesh-vault"})
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	rand.Read(key)
	for name, plain := range map[string][]byte{"mailer.smtp": []byte(secret), "mailer.mesh-seed": m.seed} {
		if _, err := vkv.Put(ctx, name, seal(t, key, plain)); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SEAT_mailer", Subjects: []string{"mesh.seat.mailer.>"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	m.publish(t, "mesh.seat.mailer.job", 5)
	m.consume(t, "SEAT_mailer", "mailer", 2)

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"mesh.event.>"}}); err != nil {
		t.Fatal(err)
	}
	m.publish(t, "mesh.event.shop.order", 4)
	m.consume(t, "EVENTS", "audit-a", 3)

	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "mesh-artifacts"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, "shop/1.0.0", bytes.Repeat([]byte("binary"), 50_000)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	return m
}

// seal seals plain with AES-GCM under key, as the vault keeps a record under its barrier.
func seal(t *testing.T, key, plain []byte) []byte {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, gcm.NonceSize())
	rand.Read(nonce)
	return gcm.Seal(nonce, nonce, plain, nil)
}

func (m *mesh) publish(t *testing.T, subject string, n int) {
	t.Helper()
	for i := range n {
		if _, err := m.js.Publish(testContext(t), subject, fmt.Appendf(nil, "message %d", i)); err != nil {
			t.Fatal(err)
		}
	}
}

// consume makes durable consumer name on stream and acks its first n messages.
func (m *mesh) consume(t *testing.T, stream, name string, n int) {
	t.Helper()
	ctx := testContext(t)
	c, err := m.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != n {
		t.Fatalf("fetched %d of %s, want %d", got, stream, n)
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mustSave saves m to a file in a fresh directory and returns its path.
func mustSave(t *testing.T, m *mesh) (string, snapshot.Manifest) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mesh.snap")
	man, err := snapshot.Save(testContext(t), m.nc, path, snapshot.Options{MeshID: "mesh-1", Operator: "UOPERATOR", Version: "v9.9.9"})
	if err != nil {
		t.Fatal(err)
	}
	return path, man
}

// TestSave_RoundTrip: a saved file opens with the mesh's streams in a restore's order (and
// no other), each with its state and consumers; a stream unpacked from it restores into a
// fresh server with its messages, sequences, KV revisions and its consumer's ack floor.
func TestSave_RoundTrip(t *testing.T) {
	m := mustMesh(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "mesh.snap")
	var progress []string
	saved, err := snapshot.Save(testContext(t), m.nc, path, snapshot.Options{
		MeshID: "mesh-1", Operator: "UOPERATOR", Version: "v9.9.9",
		Progress: func(s snapshot.Stream) { progress = append(progress, s.Name()) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"mesh.snap"}) {
		t.Fatalf("the directory holds %v after a save, want only mesh.snap (no FILE.tmp, no spool)", names)
	}
	want := []string{"KV_mesh-registry", "KV_mesh-vault", "SEAT_mailer", "EVENTS", "OBJ_mesh-artifacts"}
	if !slices.Equal(progress, want) {
		t.Fatalf("progress for %v, want %v", progress, want)
	}

	r, err := snapshot.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	man := r.Manifest()
	if man.Kind != snapshot.Kind || man.FormatVersion != snapshot.FormatVersion || man.MeshID != "mesh-1" || man.Operator != "UOPERATOR" ||
		man.MeshnodeVersion != "v9.9.9" || man.Created.Location() != time.UTC || time.Since(man.Created) > time.Minute || man.Server == "" {
		t.Fatalf("manifest %+v", man)
	}
	var names []string
	for _, s := range man.Streams {
		names = append(names, s.Name())
		if s.Size <= 0 || len(s.SHA256) != 64 || s.Entry != "streams/"+s.Name()+".snap" {
			t.Errorf("stream %s: entry %q, %d bytes, sha256 %q", s.Name(), s.Entry, s.Size, s.SHA256)
		}
	}
	if !slices.Equal(names, want) {
		t.Fatalf("streams %v, want %v", names, want)
	}
	if len(saved.Streams) != len(man.Streams) {
		t.Fatalf("Save returned %d streams, the file holds %d", len(saved.Streams), len(man.Streams))
	}
	seat := man.Streams[2]
	if st := seat.State; st.Msgs != 3 || st.FirstSeq != 3 || st.LastSeq != 5 || !slices.Equal(seat.Consumers, []string{"mailer"}) {
		t.Fatalf("SEAT_mailer in the manifest: %+v, consumers %v; want 3 messages 3–5 and mailer", st, seat.Consumers)
	}

	// Restored into a fresh server, as genesis --from-snapshot will.
	fresh := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	nc2, js2 := testbed.Connect(t, fresh)
	unpacked := t.TempDir()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	ctx := testContext(t)
	for _, s := range man.Streams {
		if err := r.Unpack(s.Name(), unpacked); err != nil {
			t.Fatal(err)
		}
		if lost, err := streammove.Restore(ctx, log, nc2, js2, unpacked, s.Stream, 1); err != nil || len(lost) > 0 {
			t.Fatalf("restore %s: lost %v, %v", s.Name(), lost, err)
		}
	}
	st, err := js2.Stream(ctx, "SEAT_mailer")
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().State; got.Msgs != 3 || got.FirstSeq != 3 || got.LastSeq != 5 {
		t.Fatalf("restored SEAT_mailer: %d messages %d–%d, want 3 messages 3–5", got.Msgs, got.FirstSeq, got.LastSeq)
	}
	for stream, c := range map[string]struct {
		name  string
		floor uint64
	}{"SEAT_mailer": {"mailer", 2}, "EVENTS": {"audit-a", 3}} {
		info, err := js2.Consumer(ctx, stream, c.name)
		if err != nil {
			t.Fatalf("restored consumer %s of %s: %v", c.name, stream, err)
		}
		if got := info.CachedInfo().AckFloor.Stream; got != c.floor {
			t.Errorf("restored consumer %s of %s: ack floor %d, want %d", c.name, stream, got, c.floor)
		}
	}
	kv, err := js2.KeyValue(ctx, "mesh-registry")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "modules.shop"); err != nil || string(e.Value()) != "v3" || e.Revision() != 3 {
		t.Fatalf("restored modules.shop: %v; want v3 at revision 3", err)
	}
	obs, err := js2.ObjectStore(ctx, "mesh-artifacts")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := obs.GetBytes(ctx, "shop/1.0.0"); err != nil || len(b) != 300_000 {
		t.Fatalf("restored artifact: %d bytes, %v; want 300000", len(b), err)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// seedPattern is an nkey seed of any kind: S, the key's type, then base32.
var seedPattern = regexp.MustCompile(`S[OAUNCPX][A-Z2-7]{56}`)

// TestSave_NoSecrets: the file holds the vault's records sealed — neither the secret's
// plaintext nor the module's seed is in it, read as a restore would — while a seed put in
// a bucket in plaintext is found by the same scan, so the scan can fail.
func TestSave_NoSecrets(t *testing.T) {
	m := mustMesh(t)
	path, _ := mustSave(t, m)
	text := testbed.SnapshotBytes(t, path)
	if !bytes.Contains(text, []byte("modules.shop")) {
		t.Fatal("the scan does not see the registry's keys: it reads the file wrongly")
	}
	if bytes.Contains(text, []byte(secret)) {
		t.Error("the file holds a vault secret in plaintext")
	}
	if seeds := seedPattern.FindAll(text, -1); len(seeds) > 0 {
		t.Errorf("the file holds %d nkey seeds", len(seeds))
	}

	kv, err := m.js.CreateKeyValue(testContext(t), jetstream.KeyValueConfig{Bucket: "mesh-kv-leaky"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(testContext(t), "oops", m.seed); err != nil {
		t.Fatal(err)
	}
	leaky, _ := mustSave(t, m)
	if found := seedPattern.FindAll(testbed.SnapshotBytes(t, leaky), -1); len(found) != 1 || !bytes.Equal(found[0], m.seed) {
		t.Fatalf("the scan found %q in a file with a planted seed, want the seed", found)
	}
}

// TestSave_Cancelled: a save cut short leaves neither the file nor its FILE.tmp or spool,
// and an existing file under the name as it was.
func TestSave_Cancelled(t *testing.T) {
	m := mustMesh(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "mesh.snap")
	for _, name := range []string{"KV_mesh-vault", "OBJ_mesh-artifacts"} {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := snapshot.Save(ctx, m.nc, path, snapshot.Options{MeshID: "mesh-1", Progress: func(s snapshot.Stream) {
			if s.Name() == name {
				cancel()
			}
		}})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a save cancelled after %s: %v, want context.Canceled", name, err)
		}
		if names := dirNames(t, dir); len(names) != 0 {
			t.Fatalf("a save cancelled after %s left %v", name, names)
		}
	}
}

// TestSave_StreamGoneMeanwhile: a stream deleted between the list and its snapshot (a seat
// removed while the save runs) is left out; the save goes on with the others.
func TestSave_StreamGoneMeanwhile(t *testing.T) {
	m := mustMesh(t)
	path := filepath.Join(t.TempDir(), "mesh.snap")
	man, err := snapshot.Save(testContext(t), m.nc, path, snapshot.Options{MeshID: "mesh-1", Progress: func(s snapshot.Stream) {
		if s.Name() == "KV_mesh-vault" {
			if err := m.js.DeleteStream(testContext(t), "SEAT_mailer"); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatalf("a save while a stream is deleted: %v", err)
	}
	var names []string
	for _, s := range man.Streams {
		names = append(names, s.Name())
	}
	if want := []string{"KV_mesh-registry", "KV_mesh-vault", "EVENTS", "OBJ_mesh-artifacts"}; !slices.Equal(names, want) {
		t.Fatalf("streams %v, want %v", names, want)
	}
	r, err := snapshot.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
}

// TestSave_WriteFails: a save whose file cannot be put in place (its name is a directory's)
// leaves no FILE.tmp and no spool behind.
func TestSave_WriteFails(t *testing.T) {
	m := mustMesh(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "mesh.snap")
	if err := os.MkdirAll(filepath.Join(path, "taken"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := snapshot.Save(testContext(t), m.nc, path, snapshot.Options{MeshID: "mesh-1"}); err == nil || !strings.Contains(err.Error(), "rename") {
		t.Fatalf("a save onto a directory: %v, want its rename refused", err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"mesh.snap"}) {
		t.Fatalf("a failed save left %v, want only the directory that was there", names)
	}
}

// TestSave_Empty: an account without the mesh's streams is refused, saying how to connect.
func TestSave_Empty(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	nc, _ := testbed.Connect(t, srv)
	path := filepath.Join(t.TempDir(), "mesh.snap")
	_, err := snapshot.Save(testContext(t), nc, path, snapshot.Options{})
	if err == nil || !strings.Contains(err.Error(), "as its operator") {
		t.Fatalf("save of an account without the mesh's streams: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused save left %s: %v", path, err)
	}
}
