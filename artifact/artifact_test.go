package artifact_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func store(t *testing.T) (jetstream.JetStream, jetstream.ObjectStore) {
	t.Helper()
	nc, err := nats.Connect(testbed.JetStream(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	obs, err := artifact.Open(context.Background(), js, 1)
	if err != nil {
		t.Fatal(err)
	}
	return js, obs
}

func file(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "artifact")
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPutFetch: an artifact is stored under its module and version with its digest; the same
// content again changes nothing, other content under the version is refused; a read checks
// the digest, and refuses content that was replaced behind the store's back.
func TestPutFetch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, obs := store(t)
	one := file(t, "#!/bin/sh\necho one\n")
	info, err := artifact.Put(ctx, obs, "shop", "1.0", one)
	if err != nil {
		t.Fatal(err)
	}
	want, size, _ := artifact.FileDigest(one)
	if info.Digest != want || info.Size != uint64(size) || info.Module != "shop" || info.Version != "1.0" {
		t.Fatalf("put: %+v, want digest %s", info, want)
	}
	if again, err := artifact.Put(ctx, obs, "shop", "1.0", one); err != nil || again.Digest != want {
		t.Fatalf("the same content again: %+v %v", again, err)
	}
	if _, err := artifact.Put(ctx, obs, "shop", "1.0", file(t, "other")); !errors.Is(err, artifact.ErrExists) {
		t.Fatalf("other content under 1.0: %v, want ErrExists", err)
	}
	var b bytes.Buffer
	if err := artifact.Fetch(ctx, js, obs, "shop", "1.0", want, &b); err != nil || b.String() != "#!/bin/sh\necho one\n" {
		t.Fatalf("fetch: %q %v", b.String(), err)
	}
	// Replaced with a valid object of other content, under the old metadata: the digest the
	// declaration names is what the read is checked against.
	oi, _ := obs.GetInfo(ctx, artifact.Name("shop", "1.0"))
	if _, err := obs.Put(ctx, oi.ObjectMeta, bytes.NewReader([]byte("#!/bin/sh\nrm -rf /\n"))); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if err := artifact.Fetch(ctx, js, obs, "shop", "1.0", want, &b); !errors.Is(err, artifact.ErrDigest) {
		t.Fatalf("fetch of replaced content: %v, want ErrDigest", err)
	}
	if err := artifact.Fetch(ctx, js, obs, "shop", "9", want, &b); !errors.Is(err, artifact.ErrNotFound) {
		t.Fatalf("fetch of an absent version: %v", err)
	}
	for _, v := range []string{"", "../x", "a b", ".hidden"} {
		if _, err := artifact.Put(ctx, obs, "shop", v, one); err == nil {
			t.Errorf("version %q accepted", v)
		}
	}
}

// TestCollect keeps each module's newest three versions and every named one, and deletes the
// rest.
func TestCollect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, obs := store(t)
	for _, v := range []string{"1", "2", "3", "4", "5"} {
		if _, err := artifact.Put(ctx, obs, "shop", v, file(t, "shop "+v)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := artifact.Put(ctx, obs, "mail", "1", file(t, "mail")); err != nil {
		t.Fatal(err)
	}
	removed, err := artifact.Collect(ctx, obs, func(module, version string) bool { return module == "shop" && version == "1" })
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0].Version != "2" {
		t.Fatalf("removed %+v, want shop 2 alone (1 is named; 3, 4, 5 are the newest)", removed)
	}
	left, _ := artifact.List(ctx, obs, "")
	var got []string
	for _, a := range left {
		got = append(got, a.Module+" "+a.Version)
	}
	if want := "[mail 1 shop 5 shop 4 shop 3 shop 1]"; fmt.Sprint(got) != want {
		t.Fatalf("left %v, want %s", got, want)
	}
}

// TestMain checks no test leaves a goroutine, but one nats.go leaks: v1.55.0's object store
// Put starts a publisher goroutine that reads its status channel after Put's deferred cleanup
// may have set it to nil, and then blocks for ever (jetstream/object.go: defer
// cleanupReplySub; publish.go: resetPendingAcksOnReconnect). The node tests ignore it too.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

// TestReadObject reads an object of many chunks whole and in order, refuses chunks that do
// not match the digest the store recorded, returns when its context ends mid-read or the
// object is deleted under it, and leaves no goroutine behind (goleak in TestMain).
func TestReadObject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, obs := store(t)
	big := make([]byte, 70<<17+12345) // 71 chunks of nats.go's 128 KiB
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := artifact.ReadObject(ctx, js, obs, artifact.Bucket, "big", &b); err != nil || !bytes.Equal(b.Bytes(), big) {
		t.Fatalf("read %d bytes (%v), want the %d put", b.Len(), err, len(big))
	}

	// One chunk rewritten in place (same subject, other bytes): the store's digest refuses it.
	info, _ := obs.GetInfo(ctx, "big")
	chunks := "$O." + artifact.Bucket + ".C." + info.NUID
	stream, err := js.Stream(ctx, "OBJ_"+artifact.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, chunks)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, m.Sequence); err != nil {
		t.Fatal(err)
	}
	forged := bytes.Clone(m.Data)
	forged[0] ^= 0xff
	if _, err := js.Publish(ctx, chunks, forged); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if err := artifact.ReadObject(ctx, js, obs, artifact.Bucket, "big", &b); !errors.Is(err, jetstream.ErrDigestMismatch) {
		t.Fatalf("read of a rewritten chunk: %v, want ErrDigestMismatch", err)
	}

	// A read whose context ends after its first chunk returns at once with that error.
	if _, err := obs.PutBytes(ctx, "other", big); err != nil {
		t.Fatal(err)
	}
	mid, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	err = artifact.ReadObject(mid, js, obs, artifact.Bucket, "other", writerFunc(func(p []byte) (int, error) { stop(); return len(p), nil }))
	if !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("a read whose context ended mid-way: %v after %s", err, time.Since(start))
	}
	// An object deleted under a read: an error that says so, not a wait.
	deleted := false
	err = artifact.ReadObject(ctx, js, obs, artifact.Bucket, "other", writerFunc(func(p []byte) (int, error) {
		if !deleted {
			deleted = true
			if err := obs.Delete(ctx, "other"); err != nil {
				return 0, err
			}
		}
		return len(p), nil
	}))
	if err == nil || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("a read of an object deleted under it: %v", err)
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
