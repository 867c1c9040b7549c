package snapshot

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/alarm"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeSchedule is a Schedule on a clock the test turns, whose save writes a small file (or
// fails, or waits for release) instead of reading a mesh.
type fakeSchedule struct {
	*Schedule
	at      time.Time
	holds   bool
	fail    error         // the next saves' error, nil: they succeed
	release chan struct{} // when set, a save waits for it
	saves   int
}

func newFakeSchedule(t *testing.T, keep int) *fakeSchedule {
	t.Helper()
	f := &fakeSchedule{at: time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC), holds: true}
	f.Schedule = &Schedule{
		Interval: time.Hour, Dir: filepath.Join(t.TempDir(), "snapshots"), Keep: keep,
		Holds: func() bool { return f.holds }, Alarms: &alarm.Set{},
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "last"}),
		Failures:    prometheus.NewCounter(prometheus.CounterOpts{Name: "failures"}),
		Log:         slog.New(slog.DiscardHandler),
		now:         func() time.Time { return f.at },
	}
	fail, release := &f.fail, &f.release // read by the save's goroutine only while the test waits
	f.save = func(ctx context.Context, path string) (Manifest, error) {
		if *release != nil {
			select {
			case <-*release:
			case <-ctx.Done():
				return Manifest{}, ctx.Err()
			}
		}
		if *fail != nil {
			return Manifest{}, *fail
		}
		return Manifest{}, os.WriteFile(path, []byte("snapshot"), 0o600)
	}
	return f
}

// step is one check at the fake clock's time plus d, waiting for the save it starts, if
// any; it reports whether a save ran.
func (f *fakeSchedule) step(t *testing.T, d time.Duration) bool {
	t.Helper()
	f.at = f.at.Add(d)
	f.check(t.Context())
	if f.running == nil {
		return false
	}
	f.finish(<-f.done)
	f.saves++
	return true
}

// files are the names in the schedule's directory, sorted.
func (f *fakeSchedule) files(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(f.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestSchedule_WritesOnlyWhileHolding: no snapshot while another node holds mesh-controller;
// one at once on taking it, then one per interval, named by its UTC time.
func TestSchedule_WritesOnlyWhileHolding(t *testing.T) {
	f := newFakeSchedule(t, 7)
	f.holds = false
	if f.step(t, 0) || f.step(t, 2*time.Hour) {
		t.Fatal("a node that does not hold mesh-controller took a snapshot")
	}
	if _, err := os.Stat(f.Dir); !os.IsNotExist(err) {
		t.Fatalf("a node that never held mesh-controller made its snapshot-dir (stat: %v)", err)
	}
	f.holds = true
	if !f.step(t, 0) {
		t.Fatal("no snapshot on taking mesh-controller")
	}
	if f.step(t, 59*time.Minute) {
		t.Fatal("a snapshot before the interval passed")
	}
	if !f.step(t, time.Minute) {
		t.Fatal("no snapshot an interval after the last")
	}
	if got, want := f.files(t), []string{"snapshot-20261206T060000Z.tar", "snapshot-20261206T070000Z.tar"}; !slices.Equal(got, want) {
		t.Fatalf("files %v, want %v", got, want)
	}
	if got, want := testutil.ToFloat64(f.LastSuccess), float64(f.at.Unix()); got != want {
		t.Fatalf("last success metric %v, want %v", got, want)
	}
	f.holds = false
	if f.step(t, 2*time.Hour) {
		t.Fatal("a snapshot after the seat was lost")
	}
}

// TestSchedule_KeepsNewest: only the newest Keep scheduled snapshots stay; the operator's
// files beside them, however they are named, are never deleted; a node taking the seat goes
// on from the newest file there and removes what a killed save left.
func TestSchedule_KeepsNewest(t *testing.T) {
	f := newFakeSchedule(t, 2)
	if err := os.MkdirAll(filepath.Join(f.Dir, "snapshot-20200101T000000Z.tar"), 0o700); err != nil {
		t.Fatal(err) // a directory named like one: not a file of the schedule's
	}
	foreign := []string{"mesh.snap", "notes.txt", "snapshot-manual.tar", "snapshot-20200101T000000Z.tar.bak", "snapshot-20201301T000000Z.tar"}
	killed := []string{"snapshot-20261206T030000Z.tar.tmp", ".snapshot-20261206T030000Z.tar.spool-123"}
	for _, name := range append(slices.Clone(foreign), killed...) {
		if err := os.WriteFile(filepath.Join(f.Dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A former holder's snapshot, 30 minutes old: the next is due in 30 minutes.
	if err := os.WriteFile(filepath.Join(f.Dir, "snapshot-20261206T033000Z.tar"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if f.step(t, 0) {
		t.Fatal("a snapshot at once, though the newest in snapshot-dir is half an interval old")
	}
	for range 4 {
		if !f.step(t, 30*time.Minute) {
			t.Fatal("no snapshot when one was due")
		}
		f.at = f.at.Add(30 * time.Minute)
	}
	want := append(slices.Clone(foreign), "snapshot-20200101T000000Z.tar", "snapshot-20261206T063000Z.tar", "snapshot-20261206T073000Z.tar")
	slices.Sort(want)
	if got := f.files(t); !slices.Equal(got, want) {
		t.Fatalf("files %v, want %v", got, want)
	}
}

// TestSchedule_Alarm: a failed snapshot raises the alarm and counts a failure; the next
// success clears it; a save running past two intervals raises it while it runs.
func TestSchedule_Alarm(t *testing.T) {
	f := newFakeSchedule(t, 7)
	f.fail = errors.New("disk full")
	f.step(t, 0)
	if err := f.Alarms.Err(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("alarm after a failed snapshot: %v, want one naming the error", err)
	}
	if got := testutil.ToFloat64(f.Failures); got != 1 {
		t.Fatalf("failures metric %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.LastSuccess); got != 0 {
		t.Fatalf("last success metric %v after a failure only, want 0", got)
	}
	// Retries come sooner than the interval, backing off: 15s, then 30s.
	if f.step(t, 14*time.Second) || !f.step(t, time.Second) {
		t.Fatal("no retry 15s after the first failure")
	}
	if f.step(t, 29*time.Second) || !f.step(t, time.Second) {
		t.Fatal("no retry 30s after the second failure")
	}
	f.fail = nil
	if !f.step(t, time.Minute) {
		t.Fatal("no retry a minute after the third failure")
	}
	if err := f.Alarms.Err(); err != nil {
		t.Fatalf("alarm after a successful snapshot: %v, want none", err)
	}

	// The next save hangs: its checks go on, and past two intervals the alarm says so.
	f.release = make(chan struct{})
	f.at = f.at.Add(time.Hour)
	f.check(t.Context())
	if f.running == nil {
		t.Fatal("no snapshot started when one was due")
	}
	f.at = f.at.Add(time.Hour)
	f.check(t.Context())
	if err := f.Alarms.Err(); err != nil {
		t.Fatalf("alarm two intervals after the last success: %v, want none yet", err)
	}
	f.at = f.at.Add(time.Minute)
	f.check(t.Context())
	if err := f.Alarms.Err(); err == nil || !strings.Contains(err.Error(), "under way") {
		t.Fatalf("alarm past two intervals with a save hanging: %v, want one saying a snapshot is under way", err)
	}
	close(f.release)
	f.finish(<-f.done)
	if err := f.Alarms.Err(); err != nil {
		t.Fatalf("alarm after the hanging save succeeded: %v, want none", err)
	}

	// A node that loses the seat drops its alarm: the new holder raises its own.
	f.fail = errors.New("disk full")
	f.step(t, time.Hour)
	if f.Alarms.Err() == nil {
		t.Fatal("no alarm after a failure")
	}
	f.holds = false
	f.step(t, 0)
	if err := f.Alarms.Err(); err != nil {
		t.Fatalf("alarm on a node that no longer holds mesh-controller: %v", err)
	}
}

// TestSchedule_StopsSaveOnLosingSeat: losing mesh-controller stops the save under way, and
// that is no failure.
func TestSchedule_StopsSaveOnLosingSeat(t *testing.T) {
	f := newFakeSchedule(t, 7)
	f.release = make(chan struct{})
	f.check(t.Context())
	f.holds = false
	f.check(t.Context())
	f.finish(<-f.done)
	if got := testutil.ToFloat64(f.Failures); got != 0 {
		t.Fatalf("failures metric %v after a stopped save, want 0", got)
	}
	if err := f.Alarms.Err(); err != nil {
		t.Fatalf("alarm after a stopped save: %v", err)
	}
}
