package formats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/membership"
)

// Shared lists the formats one server writes and another reads: the ones a mesh of mixed
// versions must agree on. The others are each node's own (its store, its audit log) or a
// file an operator carries (a snapshot, which says its version).
var Shared = []string{Declaration, Wire}

// Advertised is what a server tells the others in its gossip of each shared format: the
// oldest version it reads and the version it writes ([reads_from, writes]).
type Advertised = map[string][2]int

// Advertise returns what a server with the formats all tells the others.
func Advertise(all map[string]Version) Advertised {
	out := Advertised{}
	for _, name := range Shared {
		v := all[name]
		out[name] = [2]int{v.ReadsFrom, v.Writes}
	}
	return out
}

// baseline is what a server that advertises nothing reads and writes: a meshnode older than
// the advertisement, which wrote and read version 1 of every shared format.
var baseline = [2]int{1, 1}

// Agree returns the version of each shared format a server of the mesh writes: the newest
// every member both writes and reads, so no member is sent what it cannot read. Members are
// by name; a member without a format (older than the advertisement) reads and writes version
// 1 of it. It fails naming the members that have no version in common, and what to do.
func Agree(members map[string]Advertised) (map[string]int, error) {
	agreed := map[string]int{}
	var problems []string
	names := slices.Sorted(maps.Keys(members))
	for _, format := range Shared {
		writes, readsFrom := 0, 0
		var newest, oldest string // the member that reads from the newest version, and the one that writes the oldest
		for _, name := range names {
			v, ok := members[name][format]
			if !ok {
				v = baseline
			}
			if writes == 0 || v[1] < writes {
				writes, oldest = v[1], name
			}
			if v[0] > readsFrom {
				readsFrom, newest = v[0], name
			}
		}
		if writes < readsFrom {
			problems = append(problems, fmt.Sprintf("%s: %s writes at most version %d, and %s reads nothing older than %d",
				format, oldest, writes, newest, readsFrom))
			continue
		}
		agreed[format] = writes
	}
	if len(problems) > 0 {
		return agreed, &NoCommonVersion{Problems: problems}
	}
	return agreed, nil
}

// NoCommonVersion is Agree's failure: for each format the members have no version of in
// common, which member writes too old a version and which reads only newer ones.
type NoCommonVersion struct {
	Problems []string
}

func (e *NoCommonVersion) Error() string {
	return fmt.Sprintf("the mesh's servers have no version in common of %s: upgrade the older server or remove it (`meshnode node remove NAME`) — docs/operations.md, Upgrades",
		strings.Join(e.Problems, "; "))
}

// Switch is one shared format's agreed version rising: every member now reads the newer one.
type Switch struct {
	Format string `json:"format"`
	From   int    `json:"from"`
	To     int    `json:"to"`
}

// Watcher keeps the mesh's agreement on its shared formats up to date with the gossip, and
// reports each switch once: a newer server never writes a format an older member cannot
// read, and switches once every member runs the newer version.
type Watcher struct {
	// Members returns the mesh's members as gossip knows them, this server included.
	Members func() []membership.Member
	// OnSwitch, if set, is told each switch after the first agreement, which Log logs.
	OnSwitch func(Switch)
	// OnError, if set, is told when the agreement fails, and again when it changes; Log logs
	// it as an error.
	OnError func(error)
	// Log, if set, is where switches and failures are logged.
	Log *slog.Logger
	// Every is how often Run agrees again; zero: Recheck.
	Every time.Duration

	mu     sync.Mutex
	agreed map[string]int
	err    error
}

// Recheck is how often Run agrees again.
const Recheck = 5 * time.Second

// Run agrees again every Recheck (Every, when set) until ctx ends; it returns nil then.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(cmp.Or(w.Every, Recheck))
	defer t.Stop()
	for {
		w.Update()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Update agrees again from the members now. A member that left the mesh for good no longer
// counts; one stopped or unreachable does, since it may come back on its old version.
func (w *Watcher) Update() {
	members := map[string]Advertised{}
	for _, m := range w.Members() {
		if m.State != "left" {
			members[m.Name] = m.Formats
		}
	}
	agreed, err := Agree(members)
	w.mu.Lock()
	before, beforeErr := w.agreed, w.err
	if err == nil {
		w.agreed = agreed
	}
	w.err = err
	w.mu.Unlock()
	if err != nil {
		var now, was *NoCommonVersion
		errors.As(err, &now)
		if !errors.As(beforeErr, &was) || !slices.Equal(was.Problems, now.Problems) {
			if w.Log != nil {
				w.Log.Error("the servers cannot agree on a format", "err", err)
			}
			if w.OnError != nil {
				w.OnError(err)
			}
		}
		return
	}
	if before == nil {
		return
	}
	for _, format := range Shared {
		if from, to := before[format], agreed[format]; from != to {
			if w.Log != nil {
				w.Log.Info("the servers switched a format: every one of them reads the version written now", "format", format, "from", from, "to", to)
			}
			if w.OnSwitch != nil {
				w.OnSwitch(Switch{Format: format, From: from, To: to})
			}
		}
	}
}

// Status is Agreed for a node's status: the versions, and the failure's text ("" for none).
func (w *Watcher) Status() (map[string]int, string) {
	agreed, err := w.Agreed()
	if err != nil {
		return agreed, err.Error()
	}
	return agreed, ""
}

// Agreed returns the versions agreed last (nil before the first agreement), and why the last
// attempt failed, if it did.
func (w *Watcher) Agreed() (map[string]int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.agreed), w.err
}
