package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// TestAskWhoami_WaitsOutAMovingController: nobody answers whoami while the controller's seat
// moves to its next holder; a module connecting then is answered once it has, within its
// context, and told that no controller answers only when the context ends first.
func TestAskWhoami_WaitsOutAMovingController(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{})
	nc, _ := testbed.Connect(t, srv)
	const pub = "UMODULE"
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := askWhoami(ctx, nc, pub, true); !errors.Is(err, ErrNoResponders) {
		t.Fatalf("no controller for the whole wait: %v, want ErrNoResponders", err)
	}

	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		self, err := askWhoami(ctx, nc, pub, true)
		if err == nil && self.Module != "m" {
			err = errors.New("answered " + self.Module)
		}
		answered <- err
	}()
	time.Sleep(300 * time.Millisecond) // the seat is between holders: the asker finds nobody, and waits
	sub, err := nc.Subscribe(api.WhoamiSubject(pub), func(m *nats.Msg) {
		b, _ := json.Marshal(api.WhoamiReply{Module: "m"})
		m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := <-answered; err != nil {
		t.Fatalf("whoami once the next holder answers: %v", err)
	}
}

// TestAskWhoami_AsksAgainWhenNoAnswerComes: a connect's whoami whose first request is lost
// (the answerer takes it and says nothing, as a request lost on a leafnode link looks) asks
// again and has its answer in one short wait, not the caller's whole context; a refresh
// asks once.
func TestAskWhoami_AsksAgainWhenNoAnswerComes(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{})
	nc, _ := testbed.Connect(t, srv)
	const pub = "UKEY"
	var asked atomic.Int32
	sub, err := nc.Subscribe(api.WhoamiSubject(pub), func(m *nats.Msg) {
		if asked.Add(1) == 1 {
			return // lost
		}
		b, _ := json.Marshal(api.WhoamiReply{Module: "shop"})
		m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	self, err := askWhoamiWaiting(ctx, nc, pub, true, 200*time.Millisecond)
	if err != nil || self.Module != "shop" {
		t.Fatalf("a connect's whoami after a lost request: %+v, %v; want shop", self, err)
	}
	if took := time.Since(began); took > 10*time.Second || asked.Load() != 2 {
		t.Fatalf("answered after %v and %d requests, want the second request's answer within a short wait", took, asked.Load())
	}

	asked.Store(0)
	short, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	if _, err := askWhoamiWaiting(short, nc, pub, false, 200*time.Millisecond); err == nil || asked.Load() != 1 {
		t.Fatalf("a refresh's whoami, its one request lost: %v after %d requests, want an error after one", err, asked.Load())
	}
}
