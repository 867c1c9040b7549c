// Package chaos runs a mesh of real meshnode processes under faults and checks what it
// recorded: the cluster (a process per network namespace on one bridge), the nemesis that
// breaks it on a schedule drawn from a seed, the workload and the checkers over its history.
package chaos

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
)

// Options shape a Cluster.
type Options struct {
	// Servers is how many nodes found the mesh (genesis --expect Servers): 3 or more;
	// 0 means 5.
	Servers int
	// Spare nodes are prepared (namespace, data dir) but not started: Grow joins them.
	Spare int
	// DiskBytes is the size of the tmpfs each node's data dir is (what FillDisk fills);
	// 0 means 256 MiB. A tmpfs takes memory only for what is written to it.
	DiskBytes int64
	// Flags are more flags every node runs with.
	Flags []string
	// ReadyTimeout bounds the wait for a node's ready line; 0 means 90 s.
	ReadyTimeout time.Duration
	// Leaf makes every server take sites' leafnode links, on its address's port leafPort.
	Leaf bool
	// Binary is the meshnode the nodes found the mesh with and start with until Upgrade
	// moves them to this checkout's (an upgrade bed's older build); "" is this checkout's.
	// The CLI verbs (Meshnode, Settled) always run this checkout's.
	Binary string
}

// The ports every node listens on, on its namespace's address.
const (
	clientPort  = 4222
	httpPort    = 8222
	clusterPort = 6222
	gossipPort  = 7946
	leafPort    = 7422
)

// fillFile is the file FillDisk writes into a node's data dir.
const fillFile = "chaos-fill"

// Cluster is a mesh of meshnode processes, each in its own network namespace on one bridge;
// the test process reaches every node's client and HTTP ports through the bridge.
type Cluster struct {
	// Nodes are the founders, then the spares (not running until Grow).
	Nodes []*Node

	t            testing.TB
	o            Options
	lan          *lan
	bin          string
	env          []string // a node's environment: no MESHNODE_ variables of the test's
	work         string
	foundingFile string

	mu    sync.Mutex
	grown int      // spares joined so far
	slow  []string // the slow starts (SlowStarts)
	exits []string // the processes that ended by themselves (Exits)
}

// Exits says which node processes ended without being killed — a node that gives up is a
// finding, not a fault the nemesis injected — each with the file that holds that start's log.
func (c *Cluster) Exits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.exits)
}

// slowStart is how long a start may take to its ready line before the bed keeps the start's
// whole log: a restart is ready in seconds, and a slow one is what docs/chaos.md asks about.
const slowStart = 20 * time.Second

// SlowStarts says which starts took longer than slowStart to their ready line, each with the
// file that holds that start's whole log.
func (c *Cluster) SlowStarts() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slow)
}

// Node is one meshnode process of a Cluster, restartable on the same data dir and flags.
type Node struct {
	c     *Cluster
	index int
	name  string
	dir   string
	addr  string
	flags []string
	log   *testbed.SyncBuffer

	mu        sync.Mutex
	bin       string   // the meshnode it starts: Options.Binary until Upgrade
	verb      []string // how the next start begins: join with a token until a start was ready, then run
	cmd       *exec.Cmd
	killing   *exec.Cmd     // the process Kill signalled: its end is no finding
	done      chan struct{} // closed when the current process exited
	ready     chan struct{} // closed when the current process printed its ready line
	paused    bool
	isolated  bool
	clientURL string
	httpURL   string
}

var readyRE = regexp.MustCompile(`^meshnode ready: node (\S+), mesh (\S+), client (\S+), http (\S+)$`)

// StartCluster builds meshnode (once per test process), makes the namespaces and the data
// dirs, runs genesis --expect o.Servers on the first node, starts the founders (the others
// join with the founding token) and waits until every founder is ready. Everything —
// processes, mounts, namespaces, the bridge — is removed when t ends; a failed test logs
// the end of every node's log.
func StartCluster(t testing.TB, o Options) *Cluster {
	t.Helper()
	if o.Servers == 0 {
		o.Servers = 5
	}
	if o.DiskBytes == 0 {
		o.DiskBytes = 256 << 20
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 90 * time.Second
	}
	if o.Servers < 3 {
		t.Fatalf("chaos: Options.Servers %d: a cluster is founded by 3 or more servers", o.Servers)
	}
	c := &Cluster{t: t, o: o, lan: newLAN(t), work: t.TempDir()}
	bin, err := meshnodeBinary()
	if err != nil {
		t.Fatal(err)
	}
	c.bin = bin
	c.env = append(cleanEnv(), "XDG_CONFIG_HOME="+filepath.Join(c.work, "config"))
	for k := range o.Servers + o.Spare {
		c.Nodes = append(c.Nodes, c.prepare(t, k))
	}
	t.Cleanup(c.stopAll)

	first := c.Nodes[0]
	genesis := c.lan.command(0, first.bin, append([]string{"genesis", "--expect", strconv.Itoa(o.Servers), "--json"}, first.flags...)...)
	genesis.Env = c.env
	out, err := genesis.Output()
	if err != nil {
		t.Fatalf("chaos: genesis on %s: %v %s", first.name, err, stderrOf(err))
	}
	var g struct {
		Token  string `json:"founding_token"`
		MeshID string `json:"mesh_id"`
	}
	if err := json.Unmarshal(out, &g); err != nil || g.Token == "" {
		t.Fatalf("chaos: genesis printed no founding token (%v): %s", err, out)
	}
	c.foundingFile = filepath.Join(c.work, "founding-token")
	if err := os.WriteFile(c.foundingFile, []byte(g.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	first.verb = []string{"run"}
	for _, n := range c.Nodes[1:o.Servers] {
		n.verb = []string{"join", "--token-file", c.foundingFile}
	}
	start := time.Now()
	for _, n := range c.Nodes[:o.Servers] {
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes[:o.Servers] {
		if err := n.AwaitReady(o.ReadyTimeout); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("chaos: %d meshnode processes formed mesh %s in %s (bridge %s, %s.0/24)", o.Servers, g.MeshID,
		time.Since(start).Round(time.Millisecond), c.lan.bridge, c.lan.prefix)
	if o.Binary != "" {
		// An older meshnode's status may not report replication, which Settled reads (the
		// upgrade bed's commit does not): its founders' /readyz is what is waited for.
		testbed.RetryUntil(t, o.ReadyTimeout, func() error {
			for i := range o.Servers {
				if err := c.Ready(i); err != nil {
					return err
				}
			}
			return nil
		})
		return c
	}
	testbed.RetryUntil(t, o.ReadyTimeout, c.Settled)
	return c
}

// prepare makes node k's namespace and its data dir, a tmpfs of o.DiskBytes.
func (c *Cluster) prepare(t testing.TB, k int) *Node {
	t.Helper()
	i := c.lan.add(t)
	name := string(rune('a' + k))
	dir := filepath.Join(c.work, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", c.o.DiskBytes), "tmpfs", dir).CombinedOutput(); err != nil {
		testbed.Skip(t, "chaos: cannot mount a tmpfs for node %s's data dir (needs root): %v %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("chaos: unmount node %s's data dir %s: %v %s; unmount it by hand", name, dir, err, out)
		}
	})
	// A root node's modules run as uids of their own, which must pass through to its data dir.
	testbed.Traversable(t, dir)
	addr := c.lan.addr(i)
	flags := []string{"--data-dir", dir, "--name", name,
		"--client-addr", addr + ":" + strconv.Itoa(clientPort), "--http-addr", addr + ":" + strconv.Itoa(httpPort),
		"--cluster-addr", addr + ":" + strconv.Itoa(clusterPort), "--gossip-addr", addr + ":" + strconv.Itoa(gossipPort),
		"--log-level", "info",
		// Every node sizes its streams from the same figure, whatever its tmpfs holds at a
		// start; a full tmpfs is then a disk that refuses writes, not a smaller store.
		"--store-max-bytes", strconv.FormatInt(c.o.DiskBytes*3/4, 10)}
	if c.o.Leaf {
		flags = append(flags, "--leaf-addr", addr+":"+strconv.Itoa(leafPort))
	}
	return &Node{c: c, index: k, name: name, dir: dir, addr: addr, flags: append(flags, c.o.Flags...), log: &testbed.SyncBuffer{},
		bin: cmp.Or(c.o.Binary, c.bin)}
}

// stopAll kills every process, ends the modules' cgroups and, for a failed test, logs the
// end of each node's log.
func (c *Cluster) stopAll() {
	for _, n := range c.Nodes {
		n.Kill()
		testbed.EndNodeCgroups(n.dir)
		if c.t.Failed() && n.log.String() != "" {
			whole := filepath.Join(os.TempDir(), fmt.Sprintf("chaos-%s-node-%s.log", filepath.Base(filepath.Dir(c.work)), n.name))
			if err := os.WriteFile(whole, []byte(n.log.String()), 0o644); err == nil {
				c.t.Logf("chaos: node %s's whole log is in %s", n.name, whole)
			}
			c.t.Logf("chaos: the end of node %s's log:\n%s", n.name, tail(n.log.String(), 40))
		}
	}
}

// Grow joins k more of the spare nodes to the running mesh, with a join token for k uses,
// and waits until they are ready and the mesh is Settled: a grow from 3 to 5 is StartCluster with Servers 3 and
// Spare 2, then Grow(t, 2).
func (c *Cluster) Grow(t testing.TB, k int) {
	t.Helper()
	c.mu.Lock()
	from := c.o.Servers + c.grown
	c.mu.Unlock()
	if from+k > len(c.Nodes) {
		t.Fatalf("chaos: Grow(%d): only %d spare nodes left (Options.Spare)", k, len(c.Nodes)-from)
	}
	r := c.Meshnode(t, "token", "create", "--uses", strconv.Itoa(k), "--json")
	var tok struct{ Token string }
	if err := json.Unmarshal([]byte(r.Stdout), &tok); r.Code != 0 || err != nil || tok.Token == "" {
		t.Fatalf("chaos: token create for the grow: exit %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	file := filepath.Join(c.work, fmt.Sprintf("join-token-%d", from))
	if err := os.WriteFile(file, []byte(tok.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	grown := c.Nodes[from : from+k]
	for _, n := range grown {
		n.verb = []string{"join", "--token-file", file}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range grown {
		if err := n.AwaitReady(c.o.ReadyTimeout); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	c.grown += k
	c.mu.Unlock()
	// Until the mesh keeps its streams on the new servers too, it tolerates no more faults
	// than before the grow.
	start := time.Now()
	testbed.RetryUntil(t, c.o.ReadyTimeout, c.Settled)
	t.Logf("chaos: grown by %d to %d servers; settled %s after the joins were ready", k, from+k, time.Since(start).Round(time.Millisecond))
}

// Members are the indexes of the nodes that are part of the mesh: the founders and the
// spares grown so far, whether running or not.
func (c *Cluster) Members() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i := range c.o.Servers + c.grown {
		out = append(out, i)
	}
	return out
}

// OperatorSeed is the path of the operator's nkey seed, which genesis wrote into the first
// node's data dir: admin, sdk and the CLI's --creds connect with it.
func (c *Cluster) OperatorSeed() string {
	return filepath.Join(c.Nodes[0].dir, datadir.OperatorSeedFile)
}

// CA is the path of the mesh's CA certificate: every node's client port is TLS (its
// address is not loopback), and a client trusts this.
func (c *Cluster) CA() string { return filepath.Join(c.Nodes[0].dir, meshca.CAFile) }

// Connect connects to the mesh as the operator (every permission), through any node that
// is up, trusting the mesh's CA. The caller closes the connection.
func (c *Cluster) Connect(opts ...nats.Option) (*nats.Conn, error) {
	var urls []string
	for _, i := range c.Members() {
		if n := c.Nodes[i]; n.up() {
			urls = append(urls, n.ClientURL())
		}
	}
	if len(urls) == 0 {
		return nil, errors.New("chaos: no node is up to connect to; Start or Resume one, or Heal")
	}
	nkey, err := nats.NkeyOptionFromSeed(c.OperatorSeed())
	if err != nil {
		return nil, fmt.Errorf("chaos: read the operator's seed %s: %w", c.OperatorSeed(), err)
	}
	// The operator's inbox: where modules' tools answer.
	all := append([]nats.Option{nkey, sdk.TrustCA(c.CA()), nats.Name("chaos"), nats.CustomInboxPrefix(manifest.OperatorInbox),
		nats.Timeout(5 * time.Second)}, opts...)
	nc, err := nats.Connect(strings.Join(urls, ","), all...)
	if err != nil {
		return nil, fmt.Errorf("chaos: connect as the operator to %v: %w", urls, err)
	}
	return nc, nil
}

// Holder is the index of the member whose node holds seat (one of the mesh's own, such as
// mesh-controller or mesh-vault), as `meshnode members` on a member that is up says.
func (c *Cluster) Holder(seat string) (int, error) {
	for _, i := range c.Members() {
		n := c.Nodes[i]
		if !n.up() {
			continue
		}
		r, err := c.command("members", "--json", "--data-dir", n.dir)
		if err != nil {
			return 0, err
		}
		if r.Code != 0 {
			continue
		}
		for line := range strings.Lines(r.Stdout) {
			var m api.NodeMember
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				return 0, fmt.Errorf("chaos: members --json on %s: %w: %s", n.name, err, line)
			}
			if slices.Contains(m.Seats, seat) {
				if k := slices.IndexFunc(c.Nodes, func(n *Node) bool { return n.name == m.Name }); k >= 0 {
					return k, nil
				}
			}
		}
		return 0, fmt.Errorf("chaos: no member holds seat %s, as node %s sees them", seat, n.name)
	}
	return 0, errors.New("chaos: no member is up to ask who holds a seat")
}

// Result is what a finished meshnode command did.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Meshnode runs `meshnode args...` in the test's namespace against the mesh: as the
// operator, trusting the mesh's CA, on the data dir of the first member that is up unless
// args name a --data-dir or a --server. A command that cannot be run at all fails t.
func (c *Cluster) Meshnode(t testing.TB, args ...string) Result {
	t.Helper()
	if !slices.Contains(args, "--data-dir") && !slices.Contains(args, "--server") {
		for _, i := range c.Members() {
			if n := c.Nodes[i]; n.up() {
				args = append(args, "--data-dir", n.dir)
				break
			}
		}
	}
	return c.run(t, args...)
}

// Meshnode is Cluster.Meshnode on this node's data dir.
func (n *Node) Meshnode(t testing.TB, args ...string) Result {
	t.Helper()
	return n.c.run(t, append(args, "--data-dir", n.dir)...)
}

func (c *Cluster) run(t testing.TB, args ...string) Result {
	t.Helper()
	r, err := c.command(args...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// command runs `meshnode args...` as the operator for at most 30 s; the error is a
// command that could not be run at all.
func (c *Cluster) command(args ...string) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Env = append(slices.Clone(c.env), "MESHNODE_CREDS="+c.OperatorSeed(), "MESHNODE_CA="+c.CA())
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return Result{Code: ee.ExitCode(), Stdout: stdout.String(), Stderr: stderr.String()}, nil
	case err != nil:
		return Result{}, fmt.Errorf("chaos: run meshnode %v: %w", args, err)
	}
	return Result{Stdout: stdout.String(), Stderr: stderr.String()}, nil
}

// Settled returns nil when every member is ready and, as a member's `meshnode status`
// reports, the mesh counts every member as a server and keeps every stream at its full
// number of copies, each current: then the mesh tolerates as many faults as its size
// allows (two of five). Growing, or just after a fault, it does not yet.
func (c *Cluster) Settled() error {
	members := c.Members()
	for _, i := range members {
		if err := c.Ready(i); err != nil {
			return err
		}
	}
	var errs []error
	for _, i := range members {
		n := c.Nodes[i]
		r, err := c.command("status", "--json", "--data-dir", n.dir)
		if err != nil {
			return err
		}
		if r.Code != 0 {
			errs = append(errs, fmt.Errorf("status on %s: exit %d %s", n.name, r.Code, strings.TrimSpace(r.Stderr)))
			continue
		}
		var st api.NodeStatus
		if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
			return fmt.Errorf("chaos: status --json on %s: %w: %s", n.name, err, r.Stdout)
		}
		rep := st.Replication
		switch {
		case rep == nil:
			errs = append(errs, fmt.Errorf("node %s reports no replication yet", n.name))
			continue
		case rep.Error != "":
			errs = append(errs, fmt.Errorf("node %s: %s", n.name, rep.Error))
			continue
		case rep.Servers != len(members):
			errs = append(errs, fmt.Errorf("node %s counts %d servers, the cluster has %d members", n.name, rep.Servers, len(members)))
			continue
		}
		var off []string
		for _, s := range rep.Streams {
			if s.Replicas != rep.Target || s.Current != s.Replicas || !s.Quorum {
				off = append(off, fmt.Sprintf("%s (%d of %d copies current, want %d; %s)", s.Name, s.Current, s.Replicas, rep.Target, s.Why))
			}
		}
		if len(off) > 0 {
			return fmt.Errorf("node %s: streams not fully replicated: %s", n.name, strings.Join(off, ", "))
		}
		// One member's view of the streams is the mesh's: the others are asked only when it
		// cannot answer.
		return nil
	}
	return errors.Join(errs...)
}

// HTTPClient is a client of the nodes' HTTP addresses, which are beyond loopback and so
// HTTPS with the mesh's CA (every data dir's ca.pem); each request bounded by timeout.
func (c *Cluster) HTTPClient(timeout time.Duration) *http.Client {
	var pool *x509.CertPool
	for _, n := range c.Nodes {
		if p, err := meshca.RootCAs(filepath.Join(n.dir, meshca.CAFile)); err == nil {
			pool = p
			break
		}
	}
	client := *meshca.HTTPClient(pool)
	client.Timeout = timeout
	return &client
}

// Ready returns nil when node i's /readyz answers 200, else what it said.
func (c *Cluster) Ready(i int) error {
	n := c.Nodes[i]
	resp, err := c.HTTPClient(2 * time.Second).Get(n.HTTPURL() + "/readyz")
	if err != nil {
		return fmt.Errorf("node %s: %w", n.name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node %s: /readyz %d: %s", n.name, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// Partition cuts the network between every two of groups (node indexes): each group sees
// itself and any node in no group, which sees them all — a bridge.
func (c *Cluster) Partition(groups ...[]int) error {
	for a := range groups {
		for b := a + 1; b < len(groups); b++ {
			if err := c.lan.block(groups[a], groups[b]); err != nil {
				return fmt.Errorf("chaos: partition %v: %w", groups, err)
			}
		}
	}
	return nil
}

// Isolate takes node i off the bridge: no node and no client reaches it.
func (c *Cluster) Isolate(i int) error {
	n := c.Nodes[i]
	if err := c.lan.cut(i); err != nil {
		return fmt.Errorf("chaos: isolate node %s: %w", n.name, err)
	}
	n.mu.Lock()
	n.isolated = true
	n.mu.Unlock()
	return nil
}

// Heal ends every partition and isolation.
func (c *Cluster) Heal() error {
	if err := c.lan.heal(); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	for _, n := range c.Nodes {
		n.mu.Lock()
		n.isolated = false
		n.mu.Unlock()
	}
	return nil
}

// FillDisk fills node i's data dir (its tmpfs) with a file, leaving no byte free: the
// node's writes — JetStream's, bbolt's — fail with ENOSPC until FreeDisk.
func (c *Cluster) FillDisk(i int) error {
	n := c.Nodes[i]
	f, err := os.OpenFile(filepath.Join(n.dir, fillFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("chaos: fill node %s's disk: %w", n.name, err)
	}
	defer f.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.dir, &st); err != nil {
		return fmt.Errorf("chaos: fill node %s's disk: %w", n.name, err)
	}
	if free := int64(st.Bavail) * st.Bsize; free > 0 {
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, free); err != nil && !errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("chaos: fill node %s's disk: %w", n.name, err)
		}
	}
	// What the node wrote meanwhile, and a partial last block: written until refused.
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return fmt.Errorf("chaos: fill node %s's disk: %w", n.name, err)
		}
	}
}

// FreeDisk removes what FillDisk wrote.
func (c *Cluster) FreeDisk(i int) error {
	n := c.Nodes[i]
	if err := os.Remove(filepath.Join(n.dir, fillFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("chaos: free node %s's disk: %w", n.name, err)
	}
	return nil
}

// Name is the node's name (a, b, c, …).
func (n *Node) Name() string { return n.name }

// DataDir is the node's data dir, a tmpfs.
func (n *Node) DataDir() string { return n.dir }

// ClientURL is the node's NATS client URL, reachable from the test's namespace (TLS:
// trust Cluster.CA).
func (n *Node) ClientURL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.clientURL != "" {
		return n.clientURL
	}
	return fmt.Sprintf("tls://%s:%d", n.addr, clientPort)
}

// HTTPURL is the base URL of the node's /readyz, /metrics and status API.
func (n *Node) HTTPURL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.httpURL != "" {
		return n.httpURL
	}
	return fmt.Sprintf("https://%s:%d", n.addr, httpPort) // beyond loopback: HTTPS (HTTPClient)
}

// Start starts the node's process in its namespace — a restart is `run` on the same data
// dir with the same flags — without waiting for it to be ready (AwaitReady, Cluster.Ready).
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("chaos: node %s already runs (pid %d); Kill it first", n.name, n.cmd.Process.Pid)
	}
	if n.verb == nil {
		return fmt.Errorf("chaos: node %s is a spare: Grow joins it", n.name)
	}
	cmd := n.c.lan.command(n.index, n.bin, append(slices.Clone(n.verb), n.flags...)...)
	cmd.Env = n.c.env
	started, from := time.Now(), n.log.Len()
	fmt.Fprintf(n.log, "--- chaos: %s %s at %s\n", n.name, n.verb[0], started.Format(time.StampMilli))
	cmd.Stderr = n.log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("chaos: start node %s: %w", n.name, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start node %s: %w", n.name, err)
	}
	done, ready := make(chan struct{}), make(chan struct{})
	n.cmd, n.done, n.ready, n.paused = cmd, done, ready, false
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			m := readyRE.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			n.mu.Lock()
			n.clientURL, n.httpURL = m[3], m[4]
			// Joined: every later start is a plain run.
			n.verb = []string{"run"}
			n.mu.Unlock()
			if took := time.Since(started); took > slowStart {
				n.keepSlowStart(took, from)
			}
			close(ready)
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() {
		err := cmd.Wait()
		n.mu.Lock()
		killed := n.killing == cmd
		if n.cmd == cmd {
			n.cmd, n.paused = nil, false
		}
		n.mu.Unlock()
		if !killed {
			n.keepExit(err, started, from)
		}
		close(done)
	}()
	return nil
}

// keepSlowStart writes the log of a start that took took to its ready line (from byte from
// of the node's log) to a file that outlives the test, and records it for SlowStarts.
func (n *Node) keepSlowStart(took time.Duration, from int) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("chaos-slow-start-%s-%d.log", n.name, time.Now().Unix()))
	what := fmt.Sprintf("node %s was ready %s after its start", n.name, took.Round(time.Millisecond))
	if err := os.WriteFile(path, []byte(n.log.String()[from:]), 0o644); err != nil {
		what += fmt.Sprintf(" (its log not kept: %v)", err)
	} else {
		what += ": its log since then is in " + path
	}
	fmt.Fprintf(n.log, "--- chaos: %s\n", what)
	n.c.mu.Lock()
	n.c.slow = append(n.c.slow, what)
	n.c.mu.Unlock()
}

// keepExit records a process that ended by itself (err is its exit), started at started with
// its log from byte from, and keeps that start's log in a file that outlives the test.
func (n *Node) keepExit(err error, started time.Time, from int) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("chaos-exit-%s-%d.log", n.name, time.Now().Unix()))
	what := fmt.Sprintf("node %s (started %s) ended by itself %s later: %v", n.name, started.Format(time.StampMilli),
		time.Since(started).Round(time.Millisecond), err)
	if werr := os.WriteFile(path, []byte(n.log.String()[from:]), 0o644); werr == nil {
		what += "; its log since the start is in " + path
	}
	fmt.Fprintf(n.log, "--- chaos: %s\n", what)
	n.c.mu.Lock()
	n.c.exits = append(n.c.exits, what)
	n.c.mu.Unlock()
}

// AwaitReady waits for the current process's ready line.
func (n *Node) AwaitReady(timeout time.Duration) error {
	n.mu.Lock()
	ready, done := n.ready, n.done
	n.mu.Unlock()
	if ready == nil {
		return fmt.Errorf("chaos: node %s was never started", n.name)
	}
	select {
	case <-ready:
		return nil
	case <-done:
		return fmt.Errorf("chaos: node %s exited before it was ready:\n%s", n.name, tail(n.log.String(), 40))
	case <-time.After(timeout):
		return fmt.Errorf("chaos: node %s not ready after %s:\n%s", n.name, timeout, tail(n.log.String(), 40))
	}
}

// Kill sends SIGKILL (a paused process too) and waits until the process is gone; a node
// not running is no error.
func (n *Node) Kill() error {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	n.mu.Lock()
	n.killing = cmd
	n.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("chaos: kill node %s: %w", n.name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(20 * time.Second):
		return fmt.Errorf("chaos: node %s (pid %d) still runs 20 s after SIGKILL", n.name, cmd.Process.Pid)
	}
}

// Stop stops the node as its service manager does (SIGTERM) and waits until the process is
// gone: the node says goodbye and closes its parts. A node not running is no error.
func (n *Node) Stop() error {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	if cmd != nil {
		n.killing = cmd // an exit asked for, no finding
	}
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("chaos: stop node %s: %w", n.name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("chaos: node %s (pid %d) still runs a minute after SIGTERM:\n%s", n.name, cmd.Process.Pid, tail(n.log.String(), 40))
	}
}

// Upgrade moves node i to this checkout's meshnode as an operator does: stopped, started
// again on its data dir with the new binary, and ready. Upgrading one node at a time, and
// waiting for Settled between, is the procedure of docs/operations.md (Upgrades).
func (c *Cluster) Upgrade(i int) error {
	n := c.Nodes[i]
	if err := n.Stop(); err != nil {
		return err
	}
	n.mu.Lock()
	n.bin = c.bin
	n.mu.Unlock()
	if err := n.Start(); err != nil {
		return err
	}
	return n.AwaitReady(c.o.ReadyTimeout)
}

// Pause stops the process (SIGSTOP): it holds its connections and leases but answers
// nothing, as a long GC pause or a VM frozen would.
func (n *Node) Pause() error { return n.signal(syscall.SIGSTOP, true) }

// Resume continues a paused process (SIGCONT).
func (n *Node) Resume() error { return n.signal(syscall.SIGCONT, false) }

func (n *Node) signal(sig syscall.Signal, paused bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return fmt.Errorf("chaos: node %s does not run; Start it", n.name)
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("chaos: signal %v to node %s: %w", sig, n.name, err)
	}
	n.paused = paused
	return nil
}

// Running reports whether the node's process exists, paused or not.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// Paused reports whether the node's process is stopped by Pause.
func (n *Node) Paused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused
}

// up reports whether the node runs, unpaused and on the bridge: a client may reach it.
func (n *Node) up() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil && !n.paused && !n.isolated
}

// build is the meshnode binary, built once per test process.
var build struct {
	once sync.Once
	path string
	err  error
}

// meshnodeBinary builds ./cmd/meshnode of the module the test runs in. The binary is kept
// in one directory per checkout under the temporary directory, replaced by each build, so
// that runs leave one binary behind, not one each.
func meshnodeBinary() (string, error) {
	build.once.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		gomod := strings.TrimSpace(string(out))
		if err != nil || gomod == "" || gomod == os.DevNull {
			build.err = fmt.Errorf("chaos: find the module to build meshnode from (go env GOMOD: %q, %v); run the test inside the meshnode module", gomod, err)
			return
		}
		root := filepath.Dir(gomod)
		sum := sha256.Sum256([]byte(root))
		dir := filepath.Join(os.TempDir(), "meshnode-chaos-"+hex.EncodeToString(sum[:6]))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			build.err = fmt.Errorf("chaos: %w", err)
			return
		}
		tmp := filepath.Join(dir, fmt.Sprintf("meshnode.%d", os.Getpid()))
		cmd := exec.Command("go", "build", "-o", tmp, "./cmd/meshnode")
		cmd.Dir, cmd.Env = root, cleanEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("chaos: build meshnode in %s: %v\n%s", root, err, out)
			return
		}
		build.path = filepath.Join(dir, "meshnode")
		if err := os.Rename(tmp, build.path); err != nil {
			build.err = fmt.Errorf("chaos: %w", err)
		}
	})
	return build.path, build.err
}

// cleanEnv is the test's environment without MESHNODE_ variables: CI sets MESHNODE_BEDS,
// and no setting of whoever runs the tests may reach a node.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MESHNODE_") {
			env = append(env, kv)
		}
	}
	return env
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
