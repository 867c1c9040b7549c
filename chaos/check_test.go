package chaos_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/chaos"
)

// run is a history built by hand, with times in milliseconds since it began.
type run struct {
	ops   []chaos.Op
	final chaos.Final
}

// ok appends an operation that completed without error.
func (r *run) ok(process, kind, key, value string, epoch uint64, from, to int) {
	r.ops = append(r.ops, chaos.Op{Seq: len(r.ops), Process: process, Kind: kind, Key: key, Value: value,
		Epoch: epoch, InvokeMono: ms(from), CompleteMono: ms(to), OK: true})
}

// failed appends an operation that completed with an error.
func (r *run) failed(process, kind, key, value string, epoch uint64, from, to int, err string) {
	r.ops = append(r.ops, chaos.Op{Seq: len(r.ops), Process: process, Kind: kind, Key: key, Value: value,
		Epoch: epoch, InvokeMono: ms(from), CompleteMono: ms(to), Err: err})
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

var nodes = []string{"n1", "n2", "n3"}

// cleanRun is a run every check passes: two acked events delivered to both consumers and in
// every audit log; a holder a paused past its lease (it learns of the loss late), b acquiring
// the next epoch, a's late effect refused by the fence; two vault writes read back; one
// deploy applied everywhere; ready 2 s after healing.
func cleanRun() *run {
	r := &run{}
	r.ok("sdk", "emit", "e1", "", 0, 0, 10)
	r.ok("sdk", "emit", "e2", "", 0, 5, 20)
	for _, m := range []string{"consumer", "nodejs"} {
		r.ok(m, "deliver", "e1", "", 0, 15, 16)
		r.ok(m, "deliver", "e2", "", 0, 25, 26)
	}
	r.ok("a", "acquire", "seat", "", 1, 30, 35)
	r.ok("client", "submit", "j1", "", 0, 36, 40)
	r.ok("a", "handle", "j1", "", 1, 41, 45)
	r.ok("a", "effect", "seat", "j1", 1, 44, 44)
	r.ok("a", "renew", "seat", "", 1, 1000, 1005)
	// a is paused past its TTL: b acquires epoch 2, a learns of the loss only when it resumes.
	r.ok("b", "acquire", "seat", "", 2, 5000, 5010)
	r.ok("client", "submit", "j2", "", 0, 5020, 5025)
	r.ok("b", "handle", "j2", "", 2, 5030, 5040)
	r.ok("b", "effect", "seat", "j2", 2, 5035, 5035)
	r.failed("a", "effect", "seat", "j1-late", 1, 5050, 5050, "fenced: epoch 1 below 2")
	r.ok("a", "lose", "seat", "", 1, 5060, 5070)
	r.ok("b", "renew", "seat", "", 2, 6000, 6005)
	r.ok("b", "release", "seat", "", 2, 7000, 7010)
	r.ok("admin", "vault-write", "db", "v1", 0, 100, 110)
	r.ok("admin", "vault-write", "db", "v2", 0, 200, 210)
	r.ok("admin", "deploy", "echo", "rev 7", 0, 300, 400)

	healed := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	r.final = chaos.Final{
		Nodes:          nodes,
		Events:         []string{"e1", "e2"},
		Audit:          map[string][]string{"n1": {"e1", "e2"}, "n2": {"e2", "e1"}, "n3": {"e1", "e2"}},
		Consumers:      []string{"consumer", "nodejs"},
		Delivered:      map[string][]string{"nodejs": {"e1", "e2"}},
		Vault:          map[string]map[string]string{"n1": {"db": "v2"}, "n2": {"db": "v2"}, "n3": {"db": "v2"}},
		Plaintext:      map[string][]string{"n1": {}, "n2": {}, "n3": {}},
		Revisions:      map[string]uint64{"n1": 7, "n2": 7, "n3": 7},
		NewestRevision: 7,
		HealedAt:       healed,
		ReadyAt:        healed.Add(2 * time.Second),
		ReadyBound:     10 * time.Second,
	}
	return r
}

// without returns ids without drop.
func without(ids []string, drop string) []string {
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == drop })
}

// kinds lists the kinds of the anomalies check found.
func kinds(r *chaos.Report, check string) []string {
	var out []string
	for _, a := range r.Anomalies() {
		if a.Check == check {
			out = append(out, a.Kind)
		}
	}
	return out
}

// wantOnly fails unless the report's anomalies are exactly want's kinds, all from check.
func wantOnly(t *testing.T, r *chaos.Report, check string, want ...string) {
	t.Helper()
	var got []string
	for _, a := range r.Anomalies() {
		if a.Check != check {
			t.Errorf("unexpected %s/%s anomaly: %s", a.Check, a.Kind, a.Msg)
		}
		got = append(got, a.Kind)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s anomalies = %v, want %v\n%s", check, got, want, r)
	}
}

func TestCheck_Clean(t *testing.T) {
	c := cleanRun()
	rep := chaos.Check(c.ops, c.final, chaos.Bounds{LeaseTTL: 3 * time.Second})
	if n := len(rep.Anomalies()); n != 0 {
		t.Fatalf("a clean run has %d anomalies:\n%s", n, rep)
	}
	if s := rep.String(); !strings.Contains(s, "anomalies: 0\n") {
		t.Errorf("report lacks \"anomalies: 0\":\n%s", s)
	}
}

func TestCheck_Lost(t *testing.T) {
	t.Run("MissingFromEvents", func(t *testing.T) {
		c := cleanRun()
		c.final.Events = without(c.final.Events, "e2")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "lost-from-stream")
	})
	t.Run("MissingFromOneAudit", func(t *testing.T) {
		c := cleanRun()
		c.final.Audit["n3"] = without(c.final.Audit["n3"], "e1")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "lost-from-audit")
	})
	t.Run("AuditNotRead", func(t *testing.T) {
		c := cleanRun()
		delete(c.final.Audit, "n2")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "audit-unread")
	})
	t.Run("NeverDelivered", func(t *testing.T) {
		c := cleanRun()
		c.ops = slices.DeleteFunc(c.ops, func(op chaos.Op) bool {
			return op.Kind == "deliver" && op.Process == "nodejs" && op.Key == "e1"
		})
		c.final.Delivered["nodejs"] = without(c.final.Delivered["nodejs"], "e1")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "undelivered")
	})
	t.Run("DeliveredOnlyPerFinal", func(t *testing.T) {
		c := cleanRun() // nodejs's deliveries are read after healing, not recorded as they happened
		c.ops = slices.DeleteFunc(c.ops, func(op chaos.Op) bool { return op.Kind == "deliver" && op.Process == "nodejs" })
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost")
	})
	t.Run("SourcesLimitWhatAConsumerMustGet", func(t *testing.T) {
		c := cleanRun()
		c.ok("js", "emit", "e9", "", 0, 30, 40) // an event of a module nodejs does not consume
		c.final.Events = append(c.final.Events, "e9")
		for n := range c.final.Audit {
			c.final.Audit[n] = append(c.final.Audit[n], "e9")
		}
		c.final.Sources = map[string][]string{"nodejs": {"sdk"}}
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "undelivered") // the other consumers still must get e9
		for _, m := range c.final.Consumers {
			c.final.Sources[m] = []string{"sdk"}
		}
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost")
		c.final.Sources["nodejs"] = []string{"js"}
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "undelivered") // nodejs consumes js's e9: undelivered
	})
	t.Run("UnackedEmitMayBeLost", func(t *testing.T) {
		c := cleanRun()
		c.failed("sdk", "emit", "e3", "", 0, 50, 60, "nats: timeout")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost")
	})
	t.Run("NoConsumersNamed", func(t *testing.T) {
		c := cleanRun()
		c.final.Consumers = nil
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "no-consumers")
	})
	t.Run("JobNeverHandled", func(t *testing.T) {
		c := cleanRun()
		c.ok("client", "submit", "j3", "", 0, 8000, 8010)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "unhandled-job")
	})
	t.Run("JobWipedWithItsQueue", func(t *testing.T) {
		c := cleanRun()
		c.ok("client", "submit", "j3", "ledger", 0, 8000, 8010)
		c.ok("nemesis", "wipe", "ledger", "", 0, 8100, 8200) // the queue deleted after j3 was stored
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost")
		c.ok("client", "submit", "j4", "ledger", 0, 8300, 8310) // submitted after: must be handled
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "lost", "unhandled-job")
	})
}

func TestCheck_Duplicates(t *testing.T) {
	t.Run("DeliveredTwice", func(t *testing.T) {
		c := cleanRun()
		c.ok("consumer", "deliver", "e1", "", 0, 900, 901)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "duplicates", "delivered-twice")
	})
	t.Run("DeliveredTwicePerFinal", func(t *testing.T) {
		c := cleanRun()
		c.final.Delivered["nodejs"] = append(c.final.Delivered["nodejs"], "e2")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "duplicates", "delivered-twice")
	})
	t.Run("WithinAllowance", func(t *testing.T) {
		c := cleanRun()
		c.ok("consumer", "deliver", "e1", "", 0, 900, 901)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{MaxDeliveries: 2}), "duplicates")
	})
	t.Run("BeyondAllowance", func(t *testing.T) {
		c := cleanRun()
		c.ok("consumer", "deliver", "e1", "", 0, 900, 901)
		c.ok("consumer", "deliver", "e1", "", 0, 910, 911)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{MaxDeliveries: 2}), "duplicates", "delivered-twice")
	})
	t.Run("PerModuleAllowance", func(t *testing.T) {
		// A module without dedup may take what its consumer redelivers; the others may not.
		c := cleanRun()
		c.ok("consumer", "deliver", "e1", "", 0, 900, 901)
		c.ok("consumer", "deliver", "e1", "", 0, 910, 911)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{Deliveries: map[string]int{"consumer": 3}}), "duplicates")
		c.final.Delivered["nodejs"] = append(c.final.Delivered["nodejs"], "e2")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{Deliveries: map[string]int{"consumer": 3}}), "duplicates", "delivered-twice")
	})
	t.Run("PerConsumerAfterARemake", func(t *testing.T) {
		// Three deliveries against a MaxDeliver of 2: one too many for one consumer, within
		// what two allow when drift made it again between them; a remake before the first
		// delivery or after the last began no consumer that delivered it again.
		c := cleanRun()
		c.ok("consumer", "deliver", "e1", "", 0, 900, 901)
		c.ok("consumer", "deliver", "e1", "", 0, 910, 911)
		bounds := chaos.Bounds{Deliveries: map[string]int{"consumer": 2}}
		c.ok("nemesis", "remake", "consumer", "", 0, 5, 6)
		c.ok("nemesis", "remake", "consumer", "", 0, 950, 960)
		c.ok("nemesis", "remake", "nodejs", "", 0, 903, 904)
		wantOnly(t, chaos.Check(c.ops, c.final, bounds), "duplicates", "delivered-twice")
		c.ok("nemesis", "remake", "consumer", "", 0, 903, 904)
		wantOnly(t, chaos.Check(c.ops, c.final, bounds), "duplicates")
	})
	t.Run("HistoryAndFinalAreOneView", func(t *testing.T) {
		c := cleanRun() // nodejs's two deliveries are in both the history and Final: not four
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "duplicates")
	})
	t.Run("JobHandledTwice", func(t *testing.T) {
		c := cleanRun()
		c.ok("b", "handle", "j1", "", 2, 5100, 5110)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "duplicates", "handled-twice")
	})
	t.Run("StaleHolderOfAnUnrevokedStop", func(t *testing.T) {
		// a's server n1 stops without taking a's authority away first (an older meshnode):
		// b holds epoch 2 and handles j2; a, still handed jobs, handles j2 twice at epoch 1.
		staleRun := func() *run {
			c := cleanRun()
			for i, op := range c.ops {
				if op.Process == "a" && op.Kind == "acquire" {
					c.ops[i].Value = "n1"
				}
			}
			for _, at := range []int{5100, 5200} {
				c.ok("a", "handle", "j2", "", 1, at, at+10)
				c.failed("a", "effect", "seat", "j2", 1, at+5, at+5, "fenced: epoch 1 below 2")
			}
			return c
		}
		c := staleRun()
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "duplicates", "handled-twice")
		c.ok("operator", "unrevoked-stop", "n1", "", 0, 5050, 5300)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "duplicates")
		// A stale handle whose effect the fence accepted took effect: it counts (whatever the
		// fencing check makes of the order).
		for i, op := range c.ops {
			if op.Kind == "effect" && op.Value == "j2" && op.Process == "a" && op.InvokeMono == ms(5105) {
				c.ops[i].OK, c.ops[i].Err = true, ""
			}
		}
		if got := kinds(chaos.Check(c.ops, c.final, chaos.Bounds{}), "duplicates"); !slices.Equal(got, []string{"handled-twice"}) {
			t.Errorf("duplicates = %v with a stale handle's effect accepted, want handled-twice", got)
		}
		// Stale only inside the stop, on the stopping server, and under a superseded epoch:
		// each of these handles counts, one too many beside b's.
		for name, o := range map[string]struct {
			server string
			epoch  uint64
			at     int
		}{"AfterTheStop": {"n1", 1, 5400}, "AnotherServer": {"n2", 1, 5100}, "CurrentEpoch": {"n1", 2, 5100}} {
			t.Run(name, func(t *testing.T) {
				c := staleRun()
				c.ok("operator", "unrevoked-stop", o.server, "", 0, 5050, 5300)
				c.ok("a", "handle", "j2", "", o.epoch, o.at, o.at+10)
				wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "duplicates", "handled-twice")
			})
		}
	})
}

func TestCheck_Fencing(t *testing.T) {
	t.Run("BypassedFence", func(t *testing.T) {
		c := cleanRun()
		// the refused late effect accepted instead: a receiver that does not check epochs
		for i, op := range c.ops {
			if op.Value == "j1-late" {
				c.ops[i].OK, c.ops[i].Err = true, ""
			}
		}
		rep := chaos.Check(c.ops, c.final, chaos.Bounds{LeaseTTL: 3 * time.Second})
		wantOnly(t, rep, "fencing", "unfenced")
		if msg := rep.Anomalies()[0].Msg; !strings.Contains(msg, "epoch 1 accepted after epoch 2") ||
			!strings.Contains(msg, "accepted again after b's") {
			t.Errorf("anomaly = %q, want the decreasing epoch and the overlap named", msg)
		}
	})
	t.Run("TwoHoldersOneEpoch", func(t *testing.T) {
		c := cleanRun()
		c.ok("c", "effect", "seat", "j9", 2, 5500, 5500)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{LeaseTTL: 3 * time.Second}), "fencing", "unfenced")
	})
	t.Run("EpochOfAnotherHolder", func(t *testing.T) {
		c := cleanRun()
		c.ok("b", "acquire", "other", "", 5, 100, 110)
		c.ok("a", "effect", "other", "j5", 5, 120, 120)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{LeaseTTL: 3 * time.Second}), "fencing", "unfenced")
	})
	t.Run("NoEpoch", func(t *testing.T) {
		c := cleanRun()
		c.ok("z", "effect", "other", "j5", 0, 120, 120)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{LeaseTTL: 3 * time.Second}), "fencing", "unfenced")
	})
}

func TestCheck_Leases(t *testing.T) {
	leases := func(build func(r *run)) []chaos.Op {
		r := &run{}
		build(r)
		return r.ops
	}
	check := func(ops []chaos.Op, ttl time.Duration) []string {
		c := cleanRun()
		c.ops = append(slices.DeleteFunc(c.ops, func(op chaos.Op) bool { return op.Key == "seat" }), ops...)
		for i := range c.ops {
			c.ops[i].Seq = i
		}
		return kinds(chaos.Check(c.ops, c.final, chaos.Bounds{LeaseTTL: ttl}), "leases")
	}
	twoHolders := leases(func(r *run) {
		r.ok("a", "acquire", "seat", "", 1, 0, 10)
		r.ok("b", "acquire", "seat", "", 2, 500, 510)
		r.ok("a", "renew", "seat", "", 1, 1000, 1010) // a still holds: b's acquisition overlapped
	})
	t.Run("TwoHoldersRenewing", func(t *testing.T) {
		if got := check(twoHolders, 0); !slices.Equal(got, []string{"lease"}) {
			t.Errorf("anomalies = %v, want one lease anomaly", got)
		}
	})
	acquiredUnderHolder := leases(func(r *run) {
		r.ok("a", "acquire", "seat", "", 1, 0, 10)
		r.ok("b", "acquire", "seat", "", 2, 500, 510) // a's lease lives until 3000 at least
		r.ok("a", "lose", "seat", "", 1, 4000, 4010)
	})
	t.Run("AcquiredWithinTTL", func(t *testing.T) {
		if got := check(acquiredUnderHolder, 3*time.Second); !slices.Equal(got, []string{"lease"}) {
			t.Errorf("anomalies = %v, want one lease anomaly", got)
		}
	})
	t.Run("AcquiredWithinTTLUntimed", func(t *testing.T) {
		// without a timing assumption a lease may expire any time: nothing proves a held on
		if got := check(acquiredUnderHolder, 0); len(got) != 0 {
			t.Errorf("anomalies = %v, want none", got)
		}
	})
	t.Run("AcquiredAfterTTL", func(t *testing.T) {
		ops := leases(func(r *run) {
			r.ok("a", "acquire", "seat", "", 1, 0, 10)
			r.ok("a", "renew", "seat", "", 1, 1000, 1010)
			r.ok("b", "acquire", "seat", "", 2, 4000, 4010) // a paused past its TTL
			r.ok("a", "lose", "seat", "", 1, 9000, 9010)
		})
		if got := check(ops, 3*time.Second); len(got) != 0 {
			t.Errorf("anomalies = %v, want none", got)
		}
	})
	t.Run("EpochNotGreater", func(t *testing.T) {
		ops := leases(func(r *run) {
			r.ok("a", "acquire", "seat", "", 2, 0, 10)
			r.ok("a", "release", "seat", "", 2, 100, 110)
			r.ok("b", "acquire", "seat", "", 2, 200, 210)
		})
		if got := check(ops, 0); !slices.Equal(got, []string{"lease"}) {
			t.Errorf("anomalies = %v, want one lease anomaly", got)
		}
	})
	t.Run("ReleaseMayHaveTakenEffect", func(t *testing.T) {
		ops := leases(func(r *run) {
			r.ok("a", "acquire", "seat", "", 1, 0, 10)
			r.failed("a", "release", "seat", "", 1, 100, 5000, "nats: timeout")
			r.ok("b", "acquire", "seat", "", 2, 200, 210)
		})
		if got := check(ops, 3*time.Second); len(got) != 0 {
			t.Errorf("anomalies = %v, want none", got)
		}
	})
	t.Run("UnseenRevisions", func(t *testing.T) {
		// The watch skipped revisions after a's renewal: a deletion of a's lease may be among
		// them, so b's acquisition within a's TTL is legal; a's renewal before it still holds.
		ops := leases(func(r *run) {
			r.ok("a", "acquire", "seat", "", 1, 0, 10)
			r.ok("a", "renew", "seat", "", 1, 1000, 1010)
			r.ops = append(r.ops, chaos.Op{Seq: len(r.ops), Process: "a", Kind: "lose", Key: "seat", Epoch: 1, InvokeMono: ms(1010)})
			r.ok("a", "renew", "seat", "", 1, 1200, 1210)
			r.ok("b", "acquire", "seat", "", 2, 1500, 1510)
		})
		if got := check(ops, 3*time.Second); len(got) != 0 {
			t.Errorf("anomalies = %v, want none", got)
		}
	})
	t.Run("FailedAcquireProvesNothing", func(t *testing.T) {
		ops := leases(func(r *run) {
			r.ok("a", "acquire", "seat", "", 1, 0, 10)
			r.failed("b", "acquire", "seat", "", 0, 20, 30, "seats: held")
			r.ok("a", "renew", "seat", "", 1, 1000, 1010)
		})
		if got := check(ops, 3*time.Second); len(got) != 0 {
			t.Errorf("anomalies = %v, want none", got)
		}
	})
	t.Run("SeatsApart", func(t *testing.T) {
		ops := leases(func(r *run) {
			r.ok("a", "acquire", "seat", "", 1, 0, 10)
			r.ok("b", "acquire", "other", "", 2, 20, 30)
			r.ok("a", "renew", "seat", "", 1, 1000, 1010)
			r.ok("b", "renew", "other", "", 2, 1000, 1010)
		})
		if got := check(ops, 3*time.Second); len(got) != 0 {
			t.Errorf("anomalies = %v, want none", got)
		}
	})
}

func TestCheck_Vault(t *testing.T) {
	t.Run("NotReadBack", func(t *testing.T) {
		c := cleanRun()
		delete(c.final.Vault["n2"], "db")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "vault", "vault-unread")
	})
	t.Run("Stale", func(t *testing.T) {
		c := cleanRun()
		c.final.Vault["n3"]["db"] = "v1"
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "vault", "vault-stale")
	})
	t.Run("LaterUnackedWrite", func(t *testing.T) {
		c := cleanRun()
		c.failed("admin", "vault-write", "db", "v3", 0, 250, 260, "nats: timeout")
		c.final.Vault["n1"]["db"] = "v3"
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "vault")
	})
	t.Run("ConcurrentAckedWrites", func(t *testing.T) {
		c := cleanRun()
		c.ok("admin2", "vault-write", "db", "v2b", 0, 190, 220) // overlaps v2: either may be last
		c.final.Vault["n2"]["db"] = "v2b"
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "vault")
	})
}

func TestCheck_Plaintext(t *testing.T) {
	t.Run("Found", func(t *testing.T) {
		c := cleanRun()
		c.final.Plaintext["n2"] = []string{"/data/n2/meshnode.db"}
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "vault", "plaintext")
	})
	t.Run("NotScanned", func(t *testing.T) {
		c := cleanRun()
		delete(c.final.Plaintext, "n3")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "vault", "plaintext-unscanned")
	})
}

func TestScanPlaintext(t *testing.T) {
	const secret = "s3cr3t-0123456789abcdef"
	dir := t.TempDir()
	write := func(rel, content string, mode os.FileMode) string {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return path
	}
	write("modules/api/secrets/db", secret, 0o400)
	write("modules/api/provisions.json", `{"pg":"`+secret+`"}`, 0o600)
	write("jetstream/vault/1.blk", "sealed bytes", 0o640)
	store := write("meshnode.db", "header "+secret+" trailer", 0o600)      // the node's own store: never plaintext
	leaky := write("modules/api/secrets/env", secret, 0o644)               // a secrets file others can read
	logged := write("modules/api/output.log", "token="+secret+"\n", 0o600) // not the host's secret file
	ops := []chaos.Op{{Kind: "vault-write", Key: "db", Value: secret}}

	got, err := chaos.ScanPlaintext(dir, ops)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{store, logged, leaky}; !slices.Equal(got, want) {
		t.Errorf("ScanPlaintext = %v, want %v (in lexical order)", got, want)
	}
	if _, err := chaos.ScanPlaintext(dir, []chaos.Op{{Kind: "vault-write", Key: "db", Value: "short"}}); err == nil {
		t.Errorf("ScanPlaintext of a 5-byte value: no error, want a refusal (a match could be chance)")
	}
}

func TestCheck_Deploy(t *testing.T) {
	t.Run("NodeOnOldRevision", func(t *testing.T) {
		c := cleanRun()
		c.final.Revisions["n2"] = 6
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "deploy", "revision-behind")
	})
	t.Run("RestartForgotRevision", func(t *testing.T) {
		c := cleanRun()
		c.ok("workload", "applied", "n2", "7", 0, 500, 510)
		c.ok("workload", "applied", "n2", "3", 0, 9000, 9010) // read again after n2 restarted
		c.ok("workload", "applied", "n2", "7", 0, 9500, 9510)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "deploy", "revision-regressed")
	})
	t.Run("RestartKeptRevision", func(t *testing.T) {
		c := cleanRun()
		c.ok("workload", "applied", "n2", "6", 0, 500, 510)
		c.ok("workload", "applied", "n2", "7", 0, 9000, 9010)
		c.ok("workload", "applied", "n2", "6", 0, 9005, 9020) // overlaps the read of 7: either came first
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "deploy")
	})
	t.Run("RevisionNotRead", func(t *testing.T) {
		c := cleanRun()
		delete(c.final.Revisions, "n1")
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "deploy", "revision-unread")
	})
	t.Run("PerNodeDeclared", func(t *testing.T) {
		c := cleanRun()
		c.final.Declared = map[string]uint64{}
		for n, rev := range c.final.Revisions {
			c.final.Declared[n] = rev
		}
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "deploy")
		c.final.Declared["n2"]++
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "deploy", "revision-behind")
	})
	t.Run("NewestNotRead", func(t *testing.T) {
		c := cleanRun()
		c.final.NewestRevision = 0
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "deploy", "revision-unread")
	})
}

func TestCheck_Ready(t *testing.T) {
	t.Run("BeyondBound", func(t *testing.T) {
		c := cleanRun()
		c.final.ReadyAt = c.final.HealedAt.Add(11 * time.Second)
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "ready", "not-ready")
	})
	t.Run("Never", func(t *testing.T) {
		c := cleanRun()
		c.final.ReadyAt = time.Time{}
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "ready", "not-ready")
	})
	t.Run("NoBound", func(t *testing.T) {
		c := cleanRun()
		c.final.ReadyBound = 0
		wantOnly(t, chaos.Check(c.ops, c.final, chaos.Bounds{}), "ready", "not-ready")
	})
}
