package sandbox

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"github.com/meshnode/meshnode/api"
)

// Isolation levels a node may be configured with (config `isolation`).
const (
	// Full refuses to start a module without every mechanism the machine should give:
	// Landlock with scoping (ABI 6 or later) and a cgroup v2 per process.
	Full = "full"
	// Reduced starts modules with what the machine has, and says what is missing.
	Reduced = "reduced"
)

// minScopedABI is the first Landlock ABI that scopes signals and abstract sockets.
const minScopedABI = 6

// ErrReduced is returned by Check when full isolation cannot be had here and the node was not
// told `isolation: reduced`.
var ErrReduced = errors.New("full isolation is not available on this machine")

// System is the machine's read-only runtime every sandboxed process may read: programs,
// libraries, certificates, name resolution, time zones, and /proc (which Landlock's ptrace
// scoping keeps to the process's own domain for environ, root and cwd).
var System = []string{
	"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
	// Certificates, not /etc/ssl or /etc/pki whole: their private/ holds the host's keys.
	"/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates", "/etc/pki/tls/certs", "/etc/pki/ca-trust",
	"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf",
	"/etc/services", "/etc/protocols", "/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group",
	"/etc/mime.types", "/proc",
}

// Devices are the device files every sandboxed process may read and write.
var Devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}

// Config is how a node isolates what it runs.
type Config struct {
	// Isolation is Full or Reduced ("" is Full).
	Isolation string
	// Name names the node's cgroup subtrees; unique per data dir (see SubtreeName).
	Name string
	// Cgroup is the v2 cgroup beneath which the node makes its subtree: a path in the v2
	// hierarchy or an absolute one. "": the node's own cgroup (delegated to it by
	// systemd's Delegate=yes, or any cgroup when the node is root).
	Cgroup string
	// Users is where module uids are allocated and recorded; nil when the node is not root.
	Users *Users
	// NoUsers says why a root node has no Users (its data dir cannot be reached by them):
	// such a node starts nothing, since it runs nothing as root.
	NoUsers string
	// Exe is the launcher's binary: "" is this process's own (os.Executable).
	Exe string
	Log *slog.Logger
}

// SubtreeName is the name of a node's cgroup subtrees: the node's name and a hash of its data
// dir, so two nodes on one machine (or in one test binary) never share one, and a restarted
// node finds the one its earlier run left.
func SubtreeName(node, dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return "meshnode-" + node + "-" + hex.EncodeToString(sum[:4])
}

// Sandbox starts processes isolated, with what this machine gives.
type Sandbox struct {
	cfg     Config
	exe     string
	abi     int
	root    bool
	cg      *cgroups
	missing []string // what full isolation lacks here
	reaper  *reaper  // without a v2 cgroup
}

// Open probes the machine, makes the node's cgroup subtrees, ends what an earlier run left
// in them, and becomes a child subreaper where there is no v2 cgroup to group processes.
func Open(cfg Config) (*Sandbox, error) {
	if cfg.Isolation == "" {
		cfg.Isolation = Full
	}
	if cfg.Isolation != Full && cfg.Isolation != Reduced {
		return nil, fmt.Errorf("isolation %q: write full or reduced", cfg.Isolation)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Sandbox{cfg: cfg, root: os.Geteuid() == 0, exe: cfg.Exe}
	if s.exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find the launcher (this binary): %w", err)
		}
		s.exe = exe
	}
	if abi, err := ll.LandlockGetABIVersion(); err == nil {
		s.abi = abi
	}
	switch {
	case s.abi == 0:
		s.missing = append(s.missing, "Landlock is not available (Linux 5.13 or later, with lsm=landlock)")
	case s.abi < minScopedABI:
		s.missing = append(s.missing, fmt.Sprintf("Landlock ABI %d cannot scope signals (ABI %d, Linux 6.12, can)", s.abi, minScopedABI))
	}
	cg, why := openCgroups(cfg.Cgroup, cfg.Name, s.root)
	s.cg = cg
	if why != "" {
		s.missing = append(s.missing, "no cgroup v2 to contain processes: "+why)
	}
	if !s.root {
		s.cfg.Users = nil
	}
	s.endLeftovers()
	if cg.v2 == "" {
		r, err := startReaper(cfg.Log)
		if err != nil {
			return nil, err
		}
		s.reaper = r
	}
	return s, nil
}

// Missing says what full isolation lacks on this machine (nothing: full).
func (s *Sandbox) Missing() []string { return s.missing }

// Unenforceable names the limits this node has no controller for ("memory", "processes",
// "cpu"): with none of the v2 controllers enabled and no v1 ones it may use (an unprivileged
// node on a hybrid mount), the kernel holds none of them.
func (s *Sandbox) Unenforceable() []string {
	var out []string
	for _, c := range []struct{ name, ctl string }{{"memory", "memory"}, {"processes", "pids"}, {"cpu", "cpu"}} {
		if !s.cg.v2Ctl[c.ctl] && s.cg.v1[c.ctl] == "" {
			out = append(out, c.name)
		}
	}
	return out
}

// Check says whether the node may start modules: with full isolation, or with less when it
// was configured `isolation: reduced`.
func (s *Sandbox) Check() error {
	if len(s.missing) == 0 || s.cfg.Isolation == Reduced {
		return nil
	}
	return fmt.Errorf("%w: %s; give the machine what is missing, or start the node with `isolation: reduced` (--isolation reduced) to run modules with less", ErrReduced, strings.Join(s.missing, "; "))
}

// Close stops the reaper and removes the node's cgroup subtrees when they are empty.
func (s *Sandbox) Close() error {
	if s == nil {
		return nil
	}
	if s.reaper != nil {
		s.reaper.stop()
	}
	if s.cg.v2 != "" {
		os.Remove(s.cg.v2)
	}
	for _, d := range s.cg.v1 {
		os.Remove(d)
	}
	return nil
}

// endLeftovers kills every process an earlier run of the node left in its cgroups (it was
// killed, and nothing stopped its modules) and, as root, every process running as one of the
// module users it recorded, then removes the leaves.
func (s *Sandbox) endLeftovers() {
	for _, sub := range append([]string{s.cg.v2}, slices.Collect(maps.Values(s.cg.v1))...) {
		if sub == "" {
			continue
		}
		entries, _ := os.ReadDir(sub)
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			dir := filepath.Join(sub, e.Name())
			if n := len(procs(dir)); n > 0 {
				s.cfg.Log.Warn("ended processes an earlier run of the node left running", "cgroup", dir, "processes", n)
			}
			if sub == s.cg.v2 {
				killTree(dir)
			} else {
				killProcs(dir)
			}
			rmdirEmptied(dir)
		}
	}
	if s.cfg.Users != nil {
		if n := killUsers(s.cfg.Users.all()); n > 0 {
			s.cfg.Log.Warn("ended processes of module users an earlier run of the node left running", "processes", n)
		}
	}
}

// Proc is one process to start isolated.
type Proc struct {
	// Name is its cgroup's name, unique among the node's running processes.
	Name string
	Path string
	Args []string // without the program's name
	Env  []string
	Dir  string
	// Read and Write are the paths (files or directories) it may read (and execute), or
	// read and write, besides System and Devices.
	Read, Write    []string
	User           *User // nil: the node's
	Limits         api.Limits
	DiskDir        string // what Limits.Disk bounds
	Stdout, Stderr io.Writer
	// WaitDelay bounds the wait for its output after it exited (exec.Cmd.WaitDelay).
	WaitDelay time.Duration
}

// Causes of a process the sandbox ended, as Process.Cause says them.
const (
	CauseOOM   = "out of memory"
	CauseForks = "too many processes"
	CauseDisk  = "disk share full"
)

// Process is a started process.
type Process struct {
	Pid      int
	Landlock string // the ABI the launcher applied ("abi 7"), or "none"
	cmd      *exec.Cmd
	s        *Sandbox
	leaf     *leaf
	lim      api.Limits
	diskDir  string
	done     chan struct{} // closed when it exited
	watched  chan struct{} // closed when its watch ended
	// forks0 and ooms0 are the leaf's counts when it started.
	forks0, ooms0 int64

	mu    sync.Mutex
	cause string
}

// Start starts p: through the launcher, in a fresh cgroup, as p.User, under Landlock. It
// fails when the process cannot be started as isolated as the node is configured to demand.
func (s *Sandbox) Start(p Proc) (*Process, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	if s.root && p.User == nil {
		// Landlock does not stop a process changing the mode or owner of files its uid owns,
		// nor (below ABI 9) reaching UNIX sockets by path: as root, without a capability, it
		// could still chmod the node's seed or talk to systemd. Never.
		why := s.cfg.NoUsers
		if why == "" {
			why = "the node was given no module users"
		}
		return nil, fmt.Errorf("sandbox: a root node runs %s only as a user of its own: %s", p.Name, why)
	}
	l := launch{Path: p.Path, Args: append([]string{p.Path}, p.Args...), Dir: p.Dir, UID: -1, GID: -1}
	if p.User != nil {
		l.UID, l.GID = p.User.UID, p.User.GID
	}
	if s.abi > 0 {
		l.Landlock = true
		l.Read = append(append(append([]string{}, System...), p.Read...), p.Path)
		l.Write = append(append([]string{}, Devices...), p.Write...)
	}
	leaf, err := s.cg.makeLeaf(p.Name, p.Limits)
	if err != nil {
		return nil, err
	}
	l.Join = leaf.join
	if l.Landlock {
		// Its own cgroups, read: runtimes size their heaps and threads from memory.max and
		// cpu.max (V8, the JVM, Go), and would size them for the whole machine.
		l.Read = append(l.Read, leaf.dirs()...)
	}
	// No one file may outgrow the disk share: the kernel refuses the write (SIGXFSZ) at
	// once, where the share itself is checked every few seconds.
	l.FileSize = p.Limits.Disk
	if p.Limits.Processes > 0 && !s.cg.v2Ctl["pids"] && s.cg.v1["pids"] == "" {
		// No pids controller: the uid's task limit refuses a fork bomb's forks, and the
		// watch counts the cgroup's tasks to end it. The uid's count includes the node's
		// threads, which come and go: the limit leaves room above the one the watch ends
		// the process at.
		l.Tasks = p.Limits.Processes + 64 + p.Limits.Processes/8
	}
	spec, _ := json.Marshal(l)
	cmd := exec.Command(s.exe, LauncherArg, string(spec))
	cmd.Env, cmd.Dir = p.Env, p.Dir
	cmd.Stdout, cmd.Stderr = p.Stdout, p.Stderr
	cmd.WaitDelay = p.WaitDelay
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var cgfd *os.File
	if leaf.v2 != "" {
		if cgfd, err = os.Open(leaf.v2); err != nil {
			leaf.remove()
			return nil, fmt.Errorf("open cgroup %s: %w", leaf.v2, err)
		}
		defer cgfd.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cgfd.Fd())
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		leaf.remove()
		return nil, err
	}
	defer rd.Close()
	cmd.ExtraFiles = []*os.File{wr}
	// What the leaf counted before (a leaf an earlier run could not remove) is not this
	// process's doing. Read before it starts: a fork bomb reaches pids.max within
	// milliseconds of its exec, and on a busy machine a count read after the launcher's word
	// held the bomb's refusals already, so none was ever new (TestSupervisor_LimitsEndAndReport).
	forks0, ooms0 := leaf.events(s.cg, p.Limits)
	if s.reaper != nil {
		s.reaper.mu.Lock() // the pid is known before the reaper could see it as an orphan
	}
	err = cmd.Start()
	if s.reaper != nil {
		if err == nil {
			s.reaper.known[cmd.Process.Pid] = true
		}
		s.reaper.mu.Unlock()
	}
	wr.Close()
	if err != nil {
		leaf.remove()
		return nil, fmt.Errorf("start the launcher %s: %w", s.exe, err)
	}
	// The launcher says "ok <landlock>" before it execs and "error <why>" if it then cannot;
	// the pipe closes on exec.
	var what, detail string
	sc := bufio.NewScanner(rd)
	for sc.Scan() {
		if w, d, _ := strings.Cut(sc.Text(), " "); w != "ok" || what == "" {
			what, detail = w, d
		}
	}
	if what != "ok" {
		cmd.Wait()
		s.forget(cmd.Process.Pid)
		leaf.remove()
		if detail == "" {
			detail = "the launcher ended without a word"
		}
		if what == "exec" {
			return nil, fmt.Errorf("%w: %s", ErrExec, detail)
		}
		return nil, fmt.Errorf("sandbox: %s", detail)
	}
	proc := &Process{Pid: cmd.Process.Pid, Landlock: detail, cmd: cmd, s: s, leaf: leaf, lim: p.Limits, diskDir: p.DiskDir,
		done: make(chan struct{}), watched: make(chan struct{}), forks0: forks0, ooms0: ooms0}
	go proc.watch()
	return proc, nil
}

// ErrExec is a program the launcher could not exec (missing, or not executable).
var ErrExec = errors.New("cannot execute")

// Wait waits for the process to exit, then ends every process it left in its cgroup (or,
// without one, its process group) and removes its cgroup.
func (p *Process) Wait() error {
	err := p.cmd.Wait()
	close(p.done)
	<-p.watched    // no Kill of the watch's after this returns
	p.judge(false) // what the kernel refused it before it exited
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGXFSZ {
		p.mu.Lock()
		if p.cause == "" {
			p.cause = CauseDisk // a file outgrew the share
		}
		p.mu.Unlock()
	}
	p.Kill()
	p.leaf.remove()
	p.s.forget(p.Pid)
	return err
}

// ProcessState is the exited process's state, once Wait returned.
func (p *Process) ProcessState() *os.ProcessState { return p.cmd.ProcessState }

// Signal sends sig to the process's group.
func (p *Process) Signal(sig syscall.Signal) { syscall.Kill(-p.Pid, sig) }

// Kill ends the process and everything it started: its cgroup, its group, and (without a
// cgroup) every descendant.
func (p *Process) Kill() {
	if p.leaf.v2 != "" {
		p.leaf.kill() // everything, and no pid or group that may be reused once reaped
		return
	}
	syscall.Kill(-p.Pid, syscall.SIGKILL)
	p.leaf.kill()
	if p.s.reaper != nil {
		killDescendants(p.Pid)
	}
}

// Cause says why the sandbox ended the process ("" when it did not).
func (p *Process) Cause() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cause
}

// watchEvery is how often a running process's cgroup events and disk use are read: a fork
// bomb held at pids.max, or a directory past its share, is ended within it. 50 idle
// instances cost the node about 1% of a core at this pace (BenchmarkFiftyIdle).
const watchEvery = 2 * time.Second

// watch ends the process when the kernel refused it a fork past pids.max (a fork bomb is
// not stopped by the refusals alone), when it was OOM-killed anywhere in its cgroup, or
// when its directory outgrew its disk share.
func (p *Process) watch() {
	defer close(p.watched)
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		if p.judge(true) {
			p.Kill()
			return
		}
	}
}

// judge records why the sandbox ends the process, if it must: the kernel refused it a fork
// past pids.max, OOM-killed one of its processes, or (checked when disk is set) its
// directory outgrew its share.
func (p *Process) judge(disk bool) bool {
	forks, ooms := p.leaf.events(p.s.cg, p.lim)
	if p.lim.Processes > 0 && !p.s.cg.v2Ctl["pids"] && p.leaf.v1dir(p.s.cg, "pids") == "" && p.leaf.v2 != "" &&
		len(strings.Fields(readString(filepath.Join(p.leaf.v2, "cgroup.threads")))) >= p.lim.Processes {
		forks = p.forks0 + 1 // at its limit with no controller to hold it: a fork bomb's count
	}
	cause := ""
	switch {
	case ooms > p.ooms0:
		cause = CauseOOM
	case forks > p.forks0:
		cause = CauseForks
	case disk && p.lim.Disk > 0 && p.diskDir != "" && diskUse(p.diskDir)+p.deletedUse() >= p.lim.Disk:
		cause = CauseDisk
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cause == "" || p.cause != "" {
		return false
	}
	p.cause = cause
	return true
}

// diskUse is the bytes of the regular files beneath dir (links not followed).
func diskUse(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// deletedUse is the bytes of files the process's cgroup (or, without one, the process)
// holds open after they were removed: space the walk of its directory does not see, and
// that a module could otherwise fill a disk with.
func (p *Process) deletedUse() int64 {
	pids := []int{p.Pid}
	if p.leaf.v2 != "" {
		pids = procs(p.leaf.v2)
	}
	var n int64
	seen := map[string]bool{}
	for _, pid := range pids {
		fds := filepath.Join("/proc", strconv.Itoa(pid), "fd")
		entries, _ := os.ReadDir(fds)
		for _, e := range entries {
			fd := filepath.Join(fds, e.Name())
			target, err := os.Readlink(fd)
			if err != nil || !strings.HasSuffix(target, " (deleted)") || !strings.HasPrefix(target, "/") {
				continue
			}
			st, err := os.Stat(fd) // the open file itself
			if err != nil || !st.Mode().IsRegular() {
				continue
			}
			sys, ok := st.Sys().(*syscall.Stat_t)
			if key := fmt.Sprint(sys.Dev, ":", sys.Ino); ok && !seen[key] {
				seen[key] = true
				n += sys.Blocks * 512
			}
		}
	}
	return n
}

func (s *Sandbox) forget(pid int) {
	if s.reaper != nil {
		s.reaper.mu.Lock()
		delete(s.reaper.known, pid)
		s.reaper.mu.Unlock()
	}
}
