package build_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	bolt "go.etcd.io/bbolt"
)

// TestGit_Seat: the mesh-git seat's service without a node — it tells each branch's new head
// once (at Start, and at once when notified), exports a commit's tree to mesh-sources, says
// what a commit changed, stops serving at Stop, and refuses to start after Close.
func TestGit_Seat(t *testing.T) {
	repo := testbed.NewGitRepo(t)
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	nc, js := testbed.Connect(t, srv)
	db, err := bolt.Open(filepath.Join(t.TempDir(), "node.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	pushed := make(chan build.Pushed, 8)
	g, err := build.OpenGit(context.Background(), build.Config{
		Node: "alpha", Responder: nc, Conn: nc, JetStream: js, Replicas: func() int { return 1 },
		Publish: func(_ context.Context, seat, subject string, body []byte, _ string) error {
			if seat != build.GitSeat || subject != manifest.SeatEventSubject(build.GitSeat, "pushed") {
				t.Errorf("published %s as %s, want mesh-git's pushed", subject, seat)
			}
			var p build.Pushed
			if err := json.Unmarshal(body, &p); err != nil {
				t.Error(err)
			}
			pushed <- p
			return nil
		},
		Logger:   slog.New(slog.DiscardHandler),
		GitRepos: map[string]string{"shop": repo.Bare}, DB: db,
	})
	if err != nil {
		t.Fatal(err)
	}
	notify := func(repository string) api.GitReply {
		t.Helper()
		b, _ := json.Marshal(api.ArchiveRequest{Repository: repository})
		msg, err := nc.Request(manifest.NodeToolSubject("alpha", build.GitNotifyTool), b, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r api.GitReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	next := func(want build.Pushed) {
		t.Helper()
		select {
		case got := <-pushed:
			if got != want {
				t.Fatalf("pushed %+v, want %+v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no pushed event, want %+v", want)
		}
	}

	if r := notify("other"); !strings.Contains(r.Error, `serves no repository "other" (its git-repos: shop)`) {
		t.Errorf("notify of an unserved repository: %+v", r)
	}
	first := repo.Push(map[string]string{"services/a/main.go": "a1", "services/b/main.go": "b1"})
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	next(build.Pushed{Repository: "shop", Ref: "refs/heads/main", Commit: first})
	second := repo.Push(map[string]string{"services/a/main.go": "a2"})
	if r := notify("shop"); r.Error != "" {
		t.Fatalf("notify: %s", r.Error)
	}
	next(build.Pushed{Repository: "shop", Ref: "refs/heads/main", Commit: second, Before: first})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := build.CallGit(ctx, nc, "archive", api.ArchiveRequest{Repository: "shop", Commit: second})
	if err != nil || r.Object != "shop/"+second+".tar" {
		t.Fatalf("archive: %+v %v", r, err)
	}
	obs, err := js.ObjectStore(ctx, build.SourcesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := obs.GetInfo(ctx, r.Object); err != nil || info.Size == 0 {
		t.Fatalf("%s in %s: %+v %v", r.Object, build.SourcesBucket, info, err)
	}
	r, err = build.CallGit(ctx, nc, "changed", api.ChangedRequest{Repository: "shop", Before: first, Commit: second})
	if err != nil || !slices.Equal(r.Paths, []string{"services/a/main.go"}) {
		t.Fatalf("changed: %+v %v", r, err)
	}
	if _, err := build.CallGit(ctx, nc, "archive", api.ArchiveRequest{Repository: "other", Commit: second}); err == nil || !strings.Contains(err.Error(), `serves no repository "other"`) {
		t.Errorf("archive of an unserved repository: %v", err)
	}

	// Lost and regained at once: the new holding tells nothing already told.
	g.Stop()
	if _, err := build.CallGit(ctx, nc, "changed", api.ChangedRequest{Repository: "shop", Commit: second}); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("changed after Stop: %v, want no responders", err)
	}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	if r := notify("shop"); r.Error != "" {
		t.Fatalf("notify: %s", r.Error)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-pushed:
		t.Errorf("pushed %+v again", p)
	default:
	}
	if err := g.Start(); err == nil {
		t.Error("Start after Close: no error")
	}
}
