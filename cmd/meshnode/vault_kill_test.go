package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/vault"
)

// TestBinary_VaultRotationsSurviveKill9: while rotations run back to back, the node is killed
// with SIGKILL at random points and restarted. Every rotation the vault stored — whatever its
// caller heard — has its rotated event in the audit log, and the mint its minted event: the
// event is written with the record (an outbox), and published by whichever start comes next.
func TestBinary_VaultRotationsSurviveKill9(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	if r := meshnode(t, nil, "vault", "mint", "smtp", "--data-dir", dir); r.code != 0 {
		t.Fatalf("mint: exit %d %s", r.code, r.stderr)
	}
	// 50 rotations, two at a time; at every second pair the node is killed a random few
	// milliseconds after the callers start: before, during or after the store, or between
	// the store and its event.
	const rounds = 25
	var answered atomic.Int32
	kills := 0
	for round := 1; round <= rounds; round++ {
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := meshnode(t, nil, "vault", "rotate", "smtp", "--data-dir", dir); r.code == 0 {
					answered.Add(1)
				}
			}()
		}
		if round%2 == 0 {
			time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond) // a random point, not a wait for a state
			p.stop(t, syscall.SIGKILL)
			kills++
			wg.Wait()
			p = startNode(t, "up", upArgs(dir, "alpha")...)
		}
		wg.Wait()
	}
	t.Logf("%d rotations, %d answered, %d kills", 2*rounds, answered.Load(), kills)
	ok := &answered

	var secret vault.Meta
	r := meshnode(t, nil, "vault", "ls", "--json", "--data-dir", dir)
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var m vault.Meta
		if json.Unmarshal([]byte(line), &m) == nil && m.Name == "smtp" {
			secret = m
		}
	}
	if r.code != 0 || secret.Version < 2 || secret.Version < int(ok.Load())+1 {
		t.Fatalf("vault ls: exit %d, smtp %+v after %d answered rotations\n%s", r.code, secret, ok.Load(), r.stderr)
	}
	// Each stored version has its event in the audit log.
	missing := func() []int {
		r := meshnode(t, nil, "audit", "query", "--source", vault.Seat, "--json", "--data-dir", dir)
		seen := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var rec struct {
				Key  string          `json:"key"`
				Body json.RawMessage `json:"body"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			var body struct {
				Name    string `json:"name"`
				Version int    `json:"version"`
			}
			if json.Unmarshal(rec.Body, &body) == nil && body.Name == "smtp" {
				seen[fmt.Sprintf("%s %d", rec.Key, body.Version)] = true
			}
		}
		var out []int
		for v := 1; v <= secret.Version; v++ {
			action := "rotated"
			if v == 1 {
				action = "minted"
			}
			if !seen[fmt.Sprintf("%s.%s %d", vault.Seat, action, v)] {
				out = append(out, v)
			}
		}
		return out
	}
	var lost []int
	retryUntil(t, 30*time.Second, func() error {
		if lost = missing(); len(lost) > 0 {
			return fmt.Errorf("versions %v of %d have no event in the audit log", lost, secret.Version)
		}
		return nil
	})
}
