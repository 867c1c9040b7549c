package embedbus

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestSyncPolicy: the node's sync setting reaches JetStream — an fsync before each ack, or a
// background flush at the interval given (nats-server's 2 minutes when none is).
func TestSyncPolicy(t *testing.T) {
	for _, tc := range []struct {
		always    bool
		every     time.Duration
		wantEvery time.Duration
	}{{false, 0, 2 * time.Minute}, {false, 10 * time.Second, 10 * time.Second}, {true, 0, 0}} {
		kp, pub := newUser(t)
		b, err := Open(context.Background(), Config{Name: "n", StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t), Key: kp,
			Directory: &keys{pub: map[string]bool{pub: true}, asked: map[string]int{}}, SyncAlways: tc.always, SyncInterval: tc.every})
		if err != nil {
			t.Fatal(err)
		}
		c := b.srv.JetStreamConfig()
		b.Close()
		if c.SyncAlways != tc.always || (!tc.always && c.SyncInterval != tc.wantEvery) {
			t.Errorf("SyncAlways %v, SyncInterval %v: JetStream has %v, %v", tc.always, tc.every, c.SyncAlways, c.SyncInterval)
		}
	}
}

// TestReady_JetStreamSwitchedOff: a server whose JetStream nats-server switched off (as it
// does when the store's disk fills) is not ready, and says what to do.
func TestReady_JetStreamSwitchedOff(t *testing.T) {
	kp, pub := newUser(t)
	b, err := Open(context.Background(), Config{Name: "n", StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t), Key: kp,
		Directory: &keys{pub: map[string]bool{pub: true}, asked: map[string]int{}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Ready(ctx); err != nil {
		t.Fatalf("ready before: %v", err)
	}
	if err := b.srv.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	if err := b.Ready(ctx); err == nil || !strings.Contains(err.Error(), "free space") {
		t.Fatalf("ready with JetStream switched off: %v, want an error saying to free space and restart", err)
	}
}
