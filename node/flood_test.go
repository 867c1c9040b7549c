package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// floodBed is a node with a victim module (connects, fetches its secret, emits) and an
// attacker that floods whoami, the vault (its own secret and one it does not declare) and
// emits, as fast as one connection goes.
type floodBed struct {
	b                      *bed
	victimSeed, attackSeed string
	attackKey              string
	victim                 *sdk.Client
}

func newFloodBed(tb testing.TB) *floodBed {
	tb.Helper()
	b := newBed(tb)
	vs, _ := b.register("module: victim\nrequires: [mesh-bus]\nemits: [tick]\nsecrets: [key]\n")
	as, reg := b.register("module: attacker\nrequires: [mesh-bus]\nemits: [noise]\nsecrets: [key]\n")
	for _, owner := range []string{"victim", "attacker"} {
		if _, err := b.vault(vault.VerbMint, vault.Request{Owner: owner, Name: "key"}, nil); err != nil {
			tb.Fatal(err)
		}
	}
	return &floodBed{b: b, victimSeed: vs, attackSeed: as, attackKey: reg.PublicKey, victim: b.client(vs)}
}

// The attacker's flood: floodBatch whoami requests, vault fetches of its own secret, vault
// fetches of a secret it does not declare and emits, every floodTick.
const (
	floodBatch = 20
	floodTick  = 10 * time.Millisecond
)

// What the attacker floods.
type floodKind int

const (
	floodAll      floodKind = iota
	floodRequests           // whoami and the vault: what the rate limits bound
	floodEmits              // events: each one stored and audited, like any other
)

// flood runs the attacker in this process until stop is closed; it returns how many
// requests it sent.
func (f *floodBed) flood(tb testing.TB, stop <-chan struct{}, kind floodKind) func() int64 {
	tb.Helper()
	var sent int64
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		sent, err = attack(f.b.n.ClientURL(), f.attackSeed, f.attackKey, kind, stop)
	}()
	return func() int64 {
		<-done
		if err != nil {
			tb.Fatal(err)
		}
		return sent
	}
}

// floodAttackerEnv, when set to "URL SEED KEY KIND", makes the test binary the attacker's
// process (see attackerProcess): a module is a program of its own, and an attacker inside
// the node's process would share its heap and scheduler, which no real module does.
const floodAttackerEnv = "MESHNODE_TEST_FLOOD_ATTACKER"

// floodProcess runs the attacker as its own process until stop is closed; it returns how
// many requests it sent.
func (f *floodBed) floodProcess(tb testing.TB, stop <-chan struct{}, kind floodKind) func() int64 {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s %d", floodAttackerEnv, f.b.n.ClientURL(), f.attackSeed, f.attackKey, kind))
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { <-stop; in.Close() }()
	return func() int64 {
		if err := cmd.Wait(); err != nil {
			tb.Fatalf("the attacker's process: %v\n%s", err, out.String())
		}
		var sent int64
		if _, err := fmt.Sscan(out.String(), &sent); err != nil {
			tb.Fatalf("the attacker's process printed %q", out.String())
		}
		return sent
	}
}

// attackerProcess is the test binary started again as the attacker: it floods until its
// standard input closes, then prints how many requests it sent.
func attackerProcess() {
	var url, seed, key string
	var kind floodKind
	if _, err := fmt.Sscan(os.Getenv(floodAttackerEnv), &url, &seed, &key, &kind); err != nil {
		fmt.Fprintln(os.Stderr, "attacker: want URL SEED KEY KIND:", err)
		os.Exit(2)
	}
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	sent, err := attack(url, seed, key, kind, stop)
	if err != nil {
		fmt.Fprintln(os.Stderr, "attacker:", err)
		os.Exit(1)
	}
	fmt.Println(sent)
}

// attack is the attacker: floodBatch of each kind of request every floodTick until stop is
// closed; it returns how many it sent.
func attack(url, seedPath, key string, kind floodKind, stop <-chan struct{}) (int64, error) {
	raw, err := os.ReadFile(seedPath)
	if err != nil {
		return 0, err
	}
	kp, err := nkeys.ParseDecoratedNKey(raw)
	if err != nil {
		return 0, err
	}
	nc, err := nats.Connect(url, nats.Nkey(key, kp.Sign), nats.CustomInboxPrefix(manifest.InboxPrefix("attacker")))
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	sk, _ := envelope.NewSigningKey(kp)
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	whoami, _ := json.Marshal(registry.WhoamiRequest{PublicKey: key})
	fetch, _ := json.Marshal(vault.Request{XKey: xpub, Name: "key"})
	undeclared, _ := json.Marshal(vault.Request{XKey: xpub, Name: "not-mine"})
	inbox := manifest.InboxPrefix("attacker") + ".flood"
	subject := manifest.EventSubject("attacker", "noise")
	body := []byte(`{"noise":true}`)
	var sent int64
	// Bounded: floodBatch of each kind every floodTick, 2,000 a second of each — a hundred
	// times the rate limits, not a saturation of the machine's cores by one connection,
	// which no broker can keep from costing the others.
	tick := time.NewTicker(floodTick)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			<-js.PublishAsyncComplete()
			return sent, nil
		case <-tick.C:
		}
		for range floodBatch {
			if kind != floodEmits {
				nc.PublishRequest(registry.WhoamiSubject(key), inbox, whoami)
				nc.PublishRequest(vault.ToolSubject(vault.VerbFetch, vault.ModuleCaller("attacker")), inbox, fetch)
				nc.PublishRequest(vault.ToolSubject(vault.VerbFetch, vault.ModuleCaller("attacker")), inbox, undeclared)
				sent += 3
			}
			if kind != floodRequests {
				h, _ := envelope.Stamp(sk, "attacker", "alpha", subject, body, envelope.Options{})
				js.PublishMsgAsync(&nats.Msg{Subject: subject, Header: h, Data: body})
				sent++
			}
		}
		nc.Flush()
	}
}

// victimOps are the three things the victim must keep doing under a flood.
func (f *floodBed) victimOps(tb testing.TB) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"connect": func(ctx context.Context) error {
			c, err := sdk.Connect(ctx, f.b.n.ClientURL(), f.victimSeed)
			if err == nil {
				c.Close()
			}
			return err
		},
		"fetch": func(ctx context.Context) error { _, err := f.victim.Secret(ctx, "key"); return err },
		"emit": func(ctx context.Context) error {
			_, err := f.victim.Emit(ctx, "tick", map[string]int{"n": 1})
			return err
		},
	}
}

// victimPace spaces the victim's operations in the benchmark: a module working at a
// steady 50 a second, within the rate limit, while the attacker goes far past it.
const victimPace = 20 * time.Millisecond

// BenchmarkVictimUnderFlood measures the victim's connect, fetch and emit latency idle,
// under a flood of requests (whoami and the vault) and under a flood of emits, reporting p50
// and p99 of each (issue 11: the p99 under a flood should stay within 2× of idle). The
// attacker is a process of its own, as every module is.
// Run: go test ./node -run '^$' -bench VictimUnderFlood -benchtime 200x
func BenchmarkVictimUnderFlood(b *testing.B) {
	for _, name := range []string{"connect", "fetch", "emit"} {
		for _, load := range []string{"idle", "requests", "emits"} {
			b.Run(name+"/"+load, func(b *testing.B) {
				flooded := load != "idle"
				f := newFloodBed(b)
				op := f.victimOps(b)[name]
				var done func() int64
				stop := make(chan struct{})
				if flooded {
					kind := floodRequests
					if load == "emits" {
						kind = floodEmits
					}
					done = f.floodProcess(b, stop, kind)
				}
				lat := make([]time.Duration, 0, b.N)
				pace := time.NewTicker(victimPace)
				defer pace.Stop()
				b.ResetTimer()
				for range b.N {
					<-pace.C
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					start := time.Now()
					err := op(ctx)
					lat = append(lat, time.Since(start))
					cancel()
					if err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if flooded {
					close(stop)
					done()
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
				f.b.close()
			})
		}
	}
}
