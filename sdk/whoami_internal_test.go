package sdk

import (
	"context"
	"encoding/json"
	"errors"
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
