package metrics

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestMeter_HolderChanges: a new holder counts once, the same holder seen again (a watch that
// began anew) not at all; a vacancy is observed when the next holder comes, unless the seat
// stood free longer than a failover could.
func TestMeter_HolderChanges(t *testing.T) {
	m := NewMeter()
	a := &seats.Lease{Seat: "mailer", Scope: manifest.ScopeMesh, Module: "mailer", Instance: "i1"}
	b := &seats.Lease{Seat: "mailer", Scope: manifest.ScopeMesh, Module: "mailer", Instance: "i2"}
	m.HolderChanged(nil, a)
	m.HolderChanged(nil, a) // the watch began anew
	if n := testutil.ToFloat64(m.holderChanges.WithLabelValues("mailer")); n != 1 {
		t.Fatalf("%v holder changes after one holder seen twice, want 1", n)
	}
	m.HolderChanged(a, nil)
	m.HolderChanged(nil, b)
	if n := testutil.ToFloat64(m.holderChanges.WithLabelValues("mailer")); n != 2 {
		t.Fatalf("%v holder changes after a failover, want 2", n)
	}
	if n := testutil.CollectAndCount(m.vacancy); n != 1 || histogramCount(t, m) != 1 {
		t.Fatalf("vacancies observed: %d", histogramCount(t, m))
	}
	m.HolderChanged(b, nil)
	m.mu.Lock()
	m.vacant[seats.Key("mailer", manifest.ScopeMesh, "")] = time.Now().Add(-time.Hour)
	m.mu.Unlock()
	m.HolderChanged(nil, a)
	if n := histogramCount(t, m); n != 1 {
		t.Fatalf("an hour's vacancy was observed (%d observations), want it left out", n)
	}
}

func histogramCount(t *testing.T, m *Meter) uint64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	m.vacancy.Collect(ch)
	var d dto.Metric
	if err := (<-ch).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount()
}
