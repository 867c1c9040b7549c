package alarm_test

import (
	"testing"

	"github.com/meshnode/meshnode/alarm"
)

// TestSet: alarms stand until cleared, and Err joins their reasons in the order of their keys.
func TestSet(t *testing.T) {
	var a alarm.Set
	if err := a.Err(); err != nil {
		t.Fatalf("Err() of no alarm = %v, want nil", err)
	}
	if !a.Set("drift", "streams missing") || a.Set("drift", "streams missing") {
		t.Fatal("Set reports a reason new only the first time")
	}
	a.Set("bucket.x", "x lost")
	if got, want := a.Err().Error(), "x lost; streams missing"; got != want {
		t.Fatalf("Err()=%q, want %q", got, want)
	}
	if !a.Clear("bucket.x") || a.Clear("bucket.x") {
		t.Fatal("Clear reports a standing alarm only once")
	}
	if got, want := a.Err().Error(), "streams missing"; got != want {
		t.Fatalf("Err()=%q, want %q", got, want)
	}
}
