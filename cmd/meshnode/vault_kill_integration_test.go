//go:build integration

package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
)

// TestIntegration_Binary_VaultRotationsSurviveKill9: while rotations run back to back, the node is killed
// with SIGKILL at random points and restarted. Every rotation the vault stored — whatever its
// caller heard — has its rotated event in the audit log, and the mint its minted event: the
// event is written with the record (an outbox), and published by whichever start comes next.
func TestIntegration_Binary_VaultRotationsSurviveKill9(t *testing.T) {
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

	var secret api.VaultMeta
	r := meshnode(t, nil, "vault", "ls", "--json", "--data-dir", dir)
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var m api.VaultMeta
		if json.Unmarshal([]byte(line), &m) == nil && m.Name == "smtp" {
			secret = m
		}
	}
	if r.code != 0 || secret.Version < 2 || secret.Version < int(ok.Load())+1 {
		t.Fatalf("vault ls: exit %d, smtp %+v after %d answered rotations\n%s", r.code, secret, ok.Load(), r.stderr)
	}
	// Each stored version has its event in the audit log.
	missing := func() []int {
		r := meshnode(t, nil, "audit", "query", "--source", manifest.VaultSeat, "--json", "--data-dir", dir)
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
			if !seen[fmt.Sprintf("%s %d", envelope.Key(manifest.SeatEventSubject(manifest.VaultSeat, action)), v)] {
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

// TestIntegration_Binary_RegistryChangesSurviveKill9: registrations and removals run two at a time while
// the node is killed with SIGKILL at random points and restarted. Every module the registry
// holds has its module.registered event in the audit log, and every removal that took
// effect its module.removed event: each is stored with the change and published after it.
func TestIntegration_Binary_RegistryChangesSurviveKill9(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	// rounds runs n rounds of two commands each, killing the node a random few milliseconds
	// into every second round and starting it again.
	rounds := func(n int, command func(i int) []string) {
		for round := 0; round < n; round++ {
			var wg sync.WaitGroup
			for j := range 2 {
				args := command(2*round + j)
				wg.Add(1)
				go func() {
					defer wg.Done()
					meshnode(t, nil, append(args, "--data-dir", dir)...)
				}()
			}
			if round%2 == 1 {
				time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond) // a random point, not a wait for a state
				p.stop(t, syscall.SIGKILL)
				wg.Wait()
				p = startNode(t, "up", upArgs(dir, "alpha")...)
			}
			wg.Wait()
		}
	}
	work := t.TempDir()
	rounds(10, func(i int) []string {
		path := filepath.Join(work, fmt.Sprintf("m%d.yaml", i))
		os.WriteFile(path, []byte(fmt.Sprintf("module: m%d\nrequires: [mesh-bus]\nemits: [x]\n", i)), 0o600)
		return []string{"module", "register", path, "--creds-out", filepath.Join(work, fmt.Sprintf("m%d.nk", i))}
	})
	registered := listModules(t, dir)
	rounds(5, func(i int) []string { return []string{"module", "remove", fmt.Sprintf("m%d", i)} })
	now := listModules(t, dir)
	var removed []string
	for m := range registered {
		if !now[m] {
			removed = append(removed, m)
		}
	}
	t.Logf("%d modules registered, %d removed, %d remain", len(registered), len(removed), len(now))
	if len(now) == 0 || len(removed) == 0 {
		t.Fatalf("the bed registered %d and removed %d modules: it proves nothing", len(registered), len(removed))
	}
	retryUntil(t, 30*time.Second, func() error {
		r := meshnode(t, nil, "audit", "query", "--source", "alpha", "--json", "--data-dir", dir)
		seen := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var rec struct {
				Key  string          `json:"key"`
				Body json.RawMessage `json:"body"`
			}
			var body struct{ Module string }
			if json.Unmarshal([]byte(line), &rec) == nil && json.Unmarshal(rec.Body, &body) == nil {
				seen[rec.Key+" "+body.Module] = true
			}
		}
		var missing []string
		for m := range now {
			if !seen["node.alpha.module.registered "+m] {
				missing = append(missing, m+" registered")
			}
		}
		for _, m := range removed {
			if !seen["node.alpha.module.registered "+m] || !seen["node.alpha.module.removed "+m] {
				missing = append(missing, m+" registered and removed")
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no event for %v", missing)
		}
		return nil
	})
}

// listModules returns the names of the registered modules.
func listModules(t *testing.T, dir string) map[string]bool {
	t.Helper()
	r := meshnode(t, nil, "module", "ls", "--json", "--data-dir", dir)
	if r.code != 0 {
		t.Fatalf("module ls: exit %d %s", r.code, r.stderr)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var m struct{ Module string }
		if json.Unmarshal([]byte(line), &m) == nil && m.Module != "" {
			out[m.Module] = true
		}
	}
	return out
}
