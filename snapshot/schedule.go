package snapshot

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/meshnode/meshnode/alarm"
	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// AlarmKey is the key of the scheduled snapshots' alarm in the node's alarm.Set.
const AlarmKey = "snapshot"

// scheduledTime is the UTC time in a scheduled snapshot's name: sortable as text.
const scheduledTime = "20060102T150405Z"

// scheduledName matches a scheduled snapshot's name (group 1 its time), and leftovers
// matches what a save killed midway leaves of one: its FILE.tmp and its spool directory.
// Only these are ever deleted from the directory: it may hold the operator's own files.
var (
	scheduledName = regexp.MustCompile(`^snapshot-(\d{8}T\d{6}Z)\.tar$`)
	leftovers     = regexp.MustCompile(`^(snapshot-\d{8}T\d{6}Z\.tar\.tmp|\.snapshot-\d{8}T\d{6}Z\.tar\.spool-.*)$`)
)

// ScheduledName is the file name of the scheduled snapshot begun at t.
func ScheduledName(t time.Time) string { return "snapshot-" + t.UTC().Format(scheduledTime) + ".tar" }

// Schedule writes a snapshot of the mesh into Dir every Interval while this node holds the
// mesh-controller seat (Holds), so a mesh makes one series of them whichever server holds
// it, and keeps the newest Keep. Each file is what `meshnode snapshot save` writes — the
// mesh's foundation sealed under the barrier key included — so genesis --from-snapshot
// restores it. The last success is a metric; a failed attempt, or a last success older than
// two intervals, is an alarm in /readyz until a snapshot succeeds.
type Schedule struct {
	Interval time.Duration // between snapshots; zero: Run writes none
	Dir      string        // where the files go, made when missing
	Keep     int           // how many scheduled snapshots Dir keeps, at least 1

	Conn     *nats.Conn // the node's own connection: it lists and snapshots every stream
	MeshID   string
	Operator string // the operator's public nkey
	Version  string // meshnode's version
	Node     string // this node's name: its audit head goes into the file
	// Seal seals the mesh's foundation under the barrier key (vault.Vault.SealedFoundation):
	// a snapshot without it cannot be restored whole, so its error fails the snapshot.
	Seal func() (*api.SealedFoundation, error)
	// AuditQuery reads this node's audit log (audit.Logger.Query); nil leaves its head out.
	AuditQuery func(api.AuditFilter) ([]api.AuditRecord, error)
	Holds      func() bool // whether this node holds mesh-controller now
	Alarms     *alarm.Set  // the node's, under AlarmKey
	// LastSuccess is set to the Unix time of the last snapshot written whole; Failures
	// counts the attempts that failed.
	LastSuccess prometheus.Gauge
	Failures    prometheus.Counter
	Log         *slog.Logger

	now  func() time.Time                                         // time.Now; tests turn it
	save func(ctx context.Context, path string) (Manifest, error) // s.saveMesh; tests replace it

	holding  bool               // held mesh-controller at the last check
	since    time.Time          // when this node began holding it
	last     time.Time          // the last success: this run's, or the newest file's in Dir
	tried    time.Time          // the last attempt's start
	failure  error              // the last attempt's, nil once one succeeds
	failures int                // attempts failed in a row: the retry backs off with them
	running  context.CancelFunc // stops the save under way; nil when none is
	done     chan saved         // the save under way's outcome
}

// saved is a save's outcome.
type saved struct {
	path      string
	at        time.Time // when it began, in the file's name
	man       Manifest
	err       error
	cancelled bool          // stopped by the schedule: the node stops, or lost the seat
	took      time.Duration // wall time
}

// Run checks every quarter interval (at most a minute) whether a snapshot is due, until
// ctx ends, and waits for a save under way to stop; with Interval zero it only waits for
// ctx. A save runs beside the checks, as long as it takes: one running past two intervals
// raises the alarm while it runs.
func (s *Schedule) Run(ctx context.Context) error {
	if s.Interval <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(max(min(s.Interval/4, time.Minute), time.Millisecond))
	defer t.Stop()
	defer s.stop()
	for {
		s.check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case r := <-s.done:
			s.finish(r)
		case <-t.C:
		}
	}
}

// check starts a snapshot when one is due and this node holds mesh-controller, and sets or
// clears the alarm. Losing the seat stops a save under way: the next holder goes on.
func (s *Schedule) check(ctx context.Context) {
	if s.done == nil {
		s.done = make(chan saved, 1)
	}
	now := s.clock()
	if !s.Holds() {
		if s.holding {
			s.Log.Info("no longer holding mesh-controller: its next holder takes the scheduled snapshots")
		}
		if s.running != nil {
			s.running()
		}
		s.holding = false
		s.Alarms.Clear(AlarmKey) // the holder's to raise
		return
	}
	if !s.holding {
		s.take(now)
	}
	if s.running == nil && (s.tried.IsZero() || now.Sub(s.tried) >= s.wait()) {
		s.start(ctx, now)
	}
	s.alarm(now)
}

// firstRetry is how long after a failed snapshot the next is tried, doubling with each
// failure in a row up to the interval: a server that took mesh-controller moments before it
// had the vault's credentials (a founding server) retries within seconds, not an interval.
const firstRetry = 15 * time.Second

// wait is how long after the last attempt the next is due.
func (s *Schedule) wait() time.Duration {
	if s.failures == 0 {
		return s.Interval
	}
	return min(firstRetry<<min(s.failures-1, 16), s.Interval)
}

// stop stops the save under way, if any, and waits for it.
func (s *Schedule) stop() {
	if s.running != nil {
		s.running()
		s.finish(<-s.done)
	}
}

// take begins this node's turn: the series goes on from the newest file in Dir, and what a
// save killed midway left there is removed.
func (s *Schedule) take(now time.Time) {
	s.holding, s.since, s.failure, s.failures = true, now, nil, 0
	files, err := s.scheduled()
	if err != nil {
		s.Log.Warn("scheduled snapshots: cannot read their directory; the next snapshot tries to make it", "dir", s.Dir, "err", err)
	}
	if len(files) > 0 && !files[len(files)-1].at.After(now) {
		s.last, s.tried = files[len(files)-1].at, files[len(files)-1].at
		s.LastSuccess.Set(float64(s.last.Unix()))
	}
	entries, _ := os.ReadDir(s.Dir)
	for _, e := range entries {
		if leftovers.MatchString(e.Name()) {
			if err := os.RemoveAll(filepath.Join(s.Dir, e.Name())); err != nil {
				s.Log.Warn("scheduled snapshots: cannot remove what a save killed midway left", "path", filepath.Join(s.Dir, e.Name()), "err", err)
			}
		}
	}
}

// start begins a scheduled snapshot begun at now, beside the checks.
func (s *Schedule) start(ctx context.Context, now time.Time) {
	s.tried = now
	ctx, cancel := context.WithCancel(ctx)
	s.running = cancel
	path := filepath.Join(s.Dir, ScheduledName(now))
	go func() {
		begun := time.Now()
		man, err := s.write(ctx, path)
		s.done <- saved{path: path, at: now, man: man, err: err, cancelled: err != nil && ctx.Err() != nil, took: time.Since(begun)}
	}()
}

// finish takes a save's outcome: a success is logged, counted and pruned after, a failure
// logged and counted; a save the schedule stopped is neither.
func (s *Schedule) finish(r saved) {
	s.running()
	s.running = nil
	switch {
	case r.cancelled:
		s.Log.Info("scheduled snapshot stopped: the node stops, or no longer holds mesh-controller", "path", r.path)
	case r.err != nil:
		s.failure = r.err
		s.failures++
		s.Failures.Inc()
		s.Log.Warn("scheduled snapshot failed; /readyz reports it until one succeeds: read the error, check snapshot-dir's free space and permissions, or take one by hand with `meshnode snapshot save`",
			"path", r.path, "err", r.err, "next_in", s.wait())
	default:
		s.last, s.failure, s.failures = r.at, nil, 0
		s.LastSuccess.Set(float64(r.at.Unix()))
		var size int64
		if fi, err := os.Stat(r.path); err == nil {
			size = fi.Size()
		}
		s.Log.Info("scheduled snapshot written", "path", r.path, "bytes", size, "streams", len(r.man.Streams), "duration", r.took.Round(time.Millisecond))
		s.prune()
	}
	if s.holding {
		s.alarm(s.clock())
	}
}

// write makes Dir and saves into path.
func (s *Schedule) write(ctx context.Context, path string) (Manifest, error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return Manifest{}, fmt.Errorf("make snapshot-dir: %w", err)
	}
	if s.save != nil {
		return s.save(ctx, path)
	}
	return s.saveMesh(ctx, path)
}

// saveMesh saves the mesh as the operator's `snapshot save` does, with the foundation sealed
// here and this node's audit head.
func (s *Schedule) saveMesh(ctx context.Context, path string) (Manifest, error) {
	sealed, err := s.Seal()
	if err != nil {
		return Manifest{}, fmt.Errorf("seal the mesh's foundation for the file: %w", err)
	}
	opts := Options{MeshID: s.MeshID, Operator: s.Operator, Version: s.Version, Foundation: sealed}
	if s.AuditQuery != nil {
		recs, err := s.AuditQuery(api.AuditFilter{Last: 1})
		if err != nil {
			return Manifest{}, fmt.Errorf("read this node's audit head: %w", err)
		}
		head := api.AuditHead{}
		if len(recs) > 0 {
			head = api.AuditHead{N: recs[0].N, Hash: recs[0].Hash}
		}
		opts.AuditHeads = map[string]api.AuditHead{s.Node: head}
	}
	return Save(ctx, s.Conn, path, opts)
}

// alarm raises the alarm while the last attempt failed or the last success is older than
// two intervals (counted from when this node began holding, when that is later), and clears
// it otherwise.
func (s *Schedule) alarm(now time.Time) {
	if s.failure != nil {
		s.Alarms.Set(AlarmKey, fmt.Sprintf("the last scheduled snapshot (%s) failed: %v; see the node's log, fix it, or take one with `meshnode snapshot save`",
			s.tried.UTC().Format(time.RFC3339), s.failure))
		return
	}
	from := s.since
	if s.last.After(from) {
		from = s.last
	}
	if now.Sub(from) > 2*s.Interval {
		last := "none yet"
		if !s.last.IsZero() {
			last = s.last.UTC().Format(time.RFC3339)
		}
		busy := ""
		if s.running != nil {
			busy = fmt.Sprintf("; one under way since %s", s.tried.UTC().Format(time.RFC3339))
		}
		s.Alarms.Set(AlarmKey, fmt.Sprintf("no scheduled snapshot for more than twice snapshot-interval (%s; last: %s%s): see the node's log, or set a longer snapshot-interval if a snapshot takes that long", s.Interval, last, busy))
		return
	}
	s.Alarms.Clear(AlarmKey)
}

// scheduledFile is one scheduled snapshot in Dir.
type scheduledFile struct {
	name string
	at   time.Time
}

// scheduled lists Dir's scheduled snapshots, oldest first; a missing Dir holds none.
func (s *Schedule) scheduled() ([]scheduledFile, error) {
	entries, err := os.ReadDir(s.Dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []scheduledFile
	for _, e := range entries {
		m := scheduledName.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		at, err := time.Parse(scheduledTime, m[1])
		if err != nil {
			continue // matches the pattern but is no time (month 13): not ours
		}
		out = append(out, scheduledFile{name: e.Name(), at: at})
	}
	slices.SortFunc(out, func(a, b scheduledFile) int { return a.at.Compare(b.at) })
	return out, nil
}

// prune deletes the oldest scheduled snapshots beyond Keep; nothing else in Dir.
func (s *Schedule) prune() {
	files, err := s.scheduled()
	if err != nil {
		s.Log.Warn("scheduled snapshots: cannot list their directory to delete the oldest; check its permissions", "dir", s.Dir, "err", err)
		return
	}
	for _, f := range files[:max(len(files)-s.Keep, 0)] {
		path := filepath.Join(s.Dir, f.name)
		if err := os.Remove(path); err != nil {
			s.Log.Warn("scheduled snapshots: cannot delete an old one; delete it by hand, or check snapshot-dir's permissions", "path", path, "err", err)
			continue
		}
		s.Log.Info("old scheduled snapshot deleted", "path", path, "keep", s.Keep)
	}
}

// clock is the time now.
func (s *Schedule) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}
