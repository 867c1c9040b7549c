package host

import (
	"bytes"
	"context"
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

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/sandbox"
	"github.com/nats-io/nkeys"
)

// The states of a module and of each of its processes, as reports and `meshnode ps` say them.
const (
	StatePreparing    = "preparing"     // fetching its artifact and credentials
	StateRunning      = "running"       // its process runs
	StateWaiting      = "waiting"       // its process exited; started again after a back-off
	StateCrashLooping = "crash-looping" // it exited quickly CrashLoopAfter times in a row
	StateFailed       = "failed"        // it could not be prepared (reason says why); tried again
)

// Supervision's timings.
const (
	// StableAfter is how long a process must run for its exit not to count as a crash.
	StableAfter = 10 * time.Second
	// CrashLoopAfter quick exits in a row make a module crash-looping.
	CrashLoopAfter = 3
	// MaxRestartWait bounds the back-off between restarts.
	MaxRestartWait = time.Minute
	// DefaultGrace is how long a process has after SIGTERM before SIGKILL.
	DefaultGrace = 10 * time.Second
	// maxLog is the size at which a module's output log is rotated (one old file kept).
	maxLog = 8 << 20
)

// Report is what a host tells the controller after each apply and each change of state.
type Report struct {
	Node     string         `json:"node"`
	Revision uint64         `json:"revision"` // the declaration applied
	Modules  []ModuleReport `json:"modules"`
	Time     time.Time      `json:"time"`
}

// ModuleReport is one module on the reporting node.
type ModuleReport struct {
	Module    string           `json:"module"`
	Version   string           `json:"version"`
	State     string           `json:"state"`
	Reason    string           `json:"reason,omitempty"`
	Instances []InstanceReport `json:"instances,omitempty"`
}

// InstanceReport is one process of a module.
type InstanceReport struct {
	PID      int       `json:"pid,omitempty"`
	State    string    `json:"state"`
	Restarts int       `json:"restarts"`
	Since    time.Time `json:"since"`
	Reason   string    `json:"reason,omitempty"` // the last exit
	// Isolation is what the running process got, read back from the kernel.
	Isolation *api.Isolation `json:"isolation,omitempty"`
}

// Supervisor runs the modules a node's declaration names as processes, each in its own
// process group under Dir/<module>, and keeps them running.
type Supervisor struct {
	Dir  string // <data-dir>/modules, absolute: a process runs in its module's directory
	Node string
	// URL is the bus address a module's process connects to (MESH_URL).
	URL string
	// CA is the mesh's CA certificate file a module's process trusts (MESH_CA), when the
	// client port is TLS; "" otherwise.
	CA string
	// Artifact writes a module's artifact to w, checked against its digest.
	Artifact func(ctx context.Context, m deploy.Module, w io.Writer) error
	// Credentials fetches a module's seed and named secrets from the vault.
	Credentials func(ctx context.Context, m deploy.Module) (*api.ModuleCredentials, error)
	// Changed is told whenever what Report returns changed.
	Changed func()
	Log     *slog.Logger
	Grace   time.Duration // 0: DefaultGrace
	// Sandbox starts every process isolated (DESIGN §13); Users, when the node is root,
	// gives each module a uid of its own.
	Sandbox *sandbox.Sandbox
	Users   *sandbox.Users
	// Limits are what each instance may use when its deployment sets none.
	Limits api.Limits

	mu       sync.Mutex
	revision uint64
	mods     map[string]*module
}

// module is one supervised module.
type module struct {
	spec   deploy.Module
	cancel context.CancelFunc
	done   chan struct{}

	resume bool // start from what is on disk, if it is all there

	out    *outputLog // its instances' stdout and stderr, while they run
	prepMu sync.Mutex // one instance at a time prepares its files again (restartFiles)

	mu     sync.Mutex
	state  string
	reason string
	insts  []*instance
}

type instance struct {
	proc     *sandbox.Process // while it runs
	pid      int
	state    string
	restarts int
	since    time.Time
	reason   string
}

// Resume starts what d — the declaration the node applied before it stopped — declares, from
// what is on disk: a module whose artifact and credentials (for its declared key) are there
// starts without the bus; any other is prepared as Apply would. A node's modules run again
// before its bus reaches the mesh. First it ends what the node's earlier run left: its
// modules' processes still running, and the directories of modules d does not declare.
func (s *Supervisor) Resume(ctx context.Context, d deploy.Declaration) { s.apply(ctx, d, true) }

// Apply makes the supervisor run exactly what d declares: modules no longer declared, or
// declared differently, are stopped (a removed one's directory, credentials included, is
// deleted); new and changed ones are started. It returns once the stops are done; starting
// goes on in the background.
func (s *Supervisor) Apply(ctx context.Context, d deploy.Declaration) { s.apply(ctx, d, false) }

func (s *Supervisor) apply(ctx context.Context, d deploy.Declaration, resume bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mods == nil {
		s.mods = map[string]*module{}
	}
	if resume {
		s.sweep(d)
	}
	s.revision = d.Revision
	// Every module that goes is told to stop first, and then waited for: N processes that
	// use their grace period take one period, not N.
	var stopping []string
	for _, name := range slices.Sorted(maps.Keys(s.mods)) {
		m := s.mods[name]
		if next, declared := d.Module(name); declared && deploy.SameModules([]deploy.Module{m.spec}, []deploy.Module{next}) {
			continue
		}
		m.cancel()
		stopping = append(stopping, name)
	}
	for _, name := range stopping {
		<-s.mods[name].done
		delete(s.mods, name)
		if _, declared := d.Module(name); !declared {
			if err := os.RemoveAll(filepath.Join(s.Dir, name)); err != nil {
				s.log().Error("remove a stopped module's directory", "module", name, "err", err)
			} else if s.Users != nil {
				s.Users.Release(name)
			}
			s.log().Info("module stopped: no longer declared", "module", name)
		}
	}
	for _, spec := range d.Modules {
		if _, ok := s.mods[spec.Module]; ok {
			continue
		}
		mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		m := &module{spec: spec, cancel: cancel, done: make(chan struct{}), state: StatePreparing, resume: resume}
		s.mods[spec.Module] = m
		go func() {
			defer close(m.done)
			s.run(mctx, m)
		}()
	}
	s.changed()
}

// Stop stops every module (the node is stopping): their processes get SIGTERM, then SIGKILL
// after the grace period. Their directories stay, to start again from at the next start.
func (s *Supervisor) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.mods {
		m.cancel()
	}
	for name, m := range s.mods {
		<-m.done
		delete(s.mods, name)
	}
}

// Report describes what runs now.
func (s *Supervisor) Report() Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := Report{Node: s.Node, Revision: s.revision, Modules: []ModuleReport{}, Time: time.Now().UTC()}
	for _, name := range slices.Sorted(maps.Keys(s.mods)) {
		m := s.mods[name]
		m.mu.Lock()
		mr := ModuleReport{Module: name, Version: m.spec.Version, State: m.state, Reason: m.reason}
		for _, in := range m.insts {
			ir := InstanceReport{PID: in.pid, State: in.state, Restarts: in.restarts, Since: in.since, Reason: in.reason}
			if in.proc != nil {
				if iso, ok := in.proc.Isolation(); ok {
					ir.Isolation = &iso
				}
			}
			mr.Instances = append(mr.Instances, ir)
		}
		m.mu.Unlock()
		r.Modules = append(r.Modules, mr)
	}
	return r
}

func (s *Supervisor) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

func (s *Supervisor) changed() {
	if s.Changed != nil {
		s.Changed()
	}
}

// set records a module's state.
func (s *Supervisor) set(m *module, state, reason string) {
	m.mu.Lock()
	m.state, m.reason = state, reason
	m.mu.Unlock()
	s.changed()
}

// run prepares a module until it is ready (trying again after a failure), then runs its
// instances until ctx ends.
func (s *Supervisor) run(ctx context.Context, m *module) {
	if m.spec.Waiting != "" {
		// Not started until its provisions are ready: the controller declares it again
		// then, and this module is replaced.
		s.set(m, StateWaiting, "waiting on "+m.spec.Waiting)
		<-ctx.Done()
		return
	}
	wait := backoff.Backoff{First: time.Second, Max: MaxRestartWait}
	var path string
	for {
		var err error
		if m.resume {
			var ok bool
			if path, ok = s.onDisk(m.spec); ok {
				if err = s.own(m.spec.Module); err == nil {
					break
				}
			}
			m.resume = false
		}
		if path, err = s.prepare(ctx, m.spec); err == nil {
			if err = s.own(m.spec.Module); err == nil { // its files, its user's
				break
			}
		}
		if ctx.Err() != nil {
			return
		}
		s.log().Error("module not started", "module", m.spec.Module, "version", m.spec.Version, "err", err)
		s.set(m, StateFailed, err.Error())
		if wait.Wait(ctx) != nil {
			return
		}
	}
	logPath := filepath.Join(filepath.Dir(path), "output.log")
	out, err := openOutputLog(logPath, maxLog)
	for err != nil {
		s.log().Error("module not started: its output log", "module", m.spec.Module, "err", err)
		s.set(m, StateFailed, "output log: "+err.Error())
		if wait.Wait(ctx) != nil {
			return
		}
		out, err = openOutputLog(logPath, maxLog)
	}
	defer out.Close()
	m.out = out
	m.mu.Lock()
	m.insts = make([]*instance, m.spec.Instances)
	for i := range m.insts {
		m.insts[i] = &instance{state: StatePreparing, since: time.Now().UTC()}
	}
	m.mu.Unlock()
	s.set(m, StateRunning, "")
	var wg sync.WaitGroup
	for i := range m.spec.Instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.supervise(ctx, m, i, path)
		}()
	}
	wg.Wait()
}

// artifactPath is where a module's artifact of digest lives.
func (s *Supervisor) artifactPath(spec deploy.Module) string {
	return filepath.Join(s.Dir, spec.Module, "artifact-"+strings.TrimPrefix(spec.Digest, "sha256:")[:16])
}

// onDisk returns the artifact's path when the module's artifact and its credentials for the
// declared key are on disk already.
func (s *Supervisor) onDisk(spec deploy.Module) (string, bool) {
	path := s.artifactPath(spec)
	dir := filepath.Join(s.Dir, spec.Module)
	if _, err := os.Stat(filepath.Join(dir, preparingFile)); err == nil {
		return "", false // a preparation that did not finish
	}
	b, err := os.ReadFile(filepath.Join(dir, preparedFile))
	older := errors.Is(err, os.ErrNotExist) // prepared by a version that wrote neither marker
	if !older && (err != nil || string(b) != prepared(spec)) {
		return "", false // prepared for another spec
	}
	if digest, _, err := artifact.FileDigest(path); err != nil || digest != spec.Digest {
		return "", false // gone or damaged on disk: fetched again
	}
	seed, err := os.ReadFile(filepath.Join(s.Dir, spec.Module, "creds.nk"))
	if err != nil {
		return "", false
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		return "", false
	}
	pub, _ := kp.PublicKey()
	if needsProvisionFile(spec) {
		if _, err := os.Stat(filepath.Join(s.Dir, spec.Module, provisionsFile)); err != nil {
			return "", false
		}
	}
	if pub != spec.PublicKey {
		return "", false
	}
	if older {
		writeSecret(filepath.Join(dir, preparedFile), prepared(spec)) // best effort: checked alone again otherwise
	}
	return path, true
}

// preparingFile is written first by prepare and removed last, and preparedFile written last
// and removed first: a module directory with preparingFile is incomplete, one with
// preparedFile complete for the spec it names (what onDisk trusts at a start without the
// bus). One with neither was prepared by a version before them, and is checked alone.
const (
	preparingFile = "preparing"
	preparedFile  = "prepared"
)

// prepared is preparedFile's content for spec.
func prepared(spec deploy.Module) string { return spec.Digest + " " + spec.PublicKey + "\n" }

// provisionsFile keeps a module's provisioned credentials (0600), read at each start.
const provisionsFile = "provisions.json"

// needsProvisionFile reports whether spec has a provision whose credential the vault keeps.
func needsProvisionFile(spec deploy.Module) bool {
	return slices.ContainsFunc(spec.Provisions, func(p deploy.Provision) bool { return p.Provider != deploy.MeshProvider })
}

// provisionEnv reads the module's provisioned credentials as environment variables, each
// checked again against its interface's prefix: a provider names its own variables only.
func provisionEnv(dir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, provisionsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ps map[string]api.Provisioned
	if err := json.Unmarshal(b, &ps); err != nil {
		return nil, fmt.Errorf("%s: %w", provisionsFile, err)
	}
	var env []string
	for _, iface := range slices.Sorted(maps.Keys(ps)) {
		if err := ps[iface].Check(iface); err != nil {
			return nil, err
		}
		for _, k := range slices.Sorted(maps.Keys(ps[iface].Env)) {
			env = append(env, k+"="+ps[iface].Env[k])
		}
	}
	return env, nil
}

// prepare puts the module's artifact (checked against its digest) and its credentials under
// its directory and returns the artifact's path.
func (s *Supervisor) prepare(ctx context.Context, spec deploy.Module) (string, error) {
	dir := filepath.Join(s.Dir, spec.Module)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := writeSecret(filepath.Join(dir, preparingFile), prepared(spec)); err != nil {
		return "", err
	}
	if err := os.Remove(filepath.Join(dir, preparedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	path := s.artifactPath(spec)
	if digest, _, err := artifact.FileDigest(path); err != nil || digest != spec.Digest {
		os.Remove(path) // damaged on disk, if there
		tmp, err := os.CreateTemp(dir, ".artifact-*")
		if err != nil {
			return "", err
		}
		defer os.Remove(tmp.Name())
		err = s.Artifact(ctx, spec, tmp)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return "", fmt.Errorf("artifact %s %s: %w", spec.Module, spec.Version, err)
		}
		if err := os.Chmod(tmp.Name(), 0o555); err != nil { // the module's user reads and runs it
			return "", err
		}
		if err := os.Rename(tmp.Name(), path); err != nil {
			return "", err
		}
	}
	creds, err := s.Credentials(ctx, spec)
	if err != nil {
		return "", fmt.Errorf("credentials of %s: %w", spec.Module, err)
	}
	if err := writeSecret(filepath.Join(dir, "creds.nk"), creds.Seed); err != nil {
		return "", err
	}
	// Each file is replaced in place (written aside, renamed over), and only then are the
	// ones no longer given removed: an instance starting meanwhile (a sibling of one whose
	// start failed) never finds a secret or its provisions missing.
	secrets := filepath.Join(dir, "secrets")
	if len(creds.Secrets) > 0 {
		if err := os.MkdirAll(secrets, 0o700); err != nil {
			return "", err
		}
		for name, value := range creds.Secrets {
			if err := writeSecret(filepath.Join(secrets, name), value); err != nil {
				return "", err
			}
		}
		stale, _ := os.ReadDir(secrets)
		for _, e := range stale {
			if _, given := creds.Secrets[e.Name()]; !given {
				os.RemoveAll(filepath.Join(secrets, e.Name()))
			}
		}
	} else {
		os.RemoveAll(secrets)
	}
	if len(creds.Provisions) > 0 {
		b, _ := json.Marshal(creds.Provisions)
		if err := writeSecret(filepath.Join(dir, provisionsFile), string(b)); err != nil {
			return "", err
		}
	} else {
		os.Remove(filepath.Join(dir, provisionsFile))
	}
	// Older artifacts of the module are not kept.
	olds, _ := filepath.Glob(filepath.Join(dir, "artifact-*"))
	for _, old := range olds {
		if old != path {
			os.Remove(old)
		}
	}
	if err := writeSecret(filepath.Join(dir, preparedFile), prepared(spec)); err != nil {
		return "", err
	}
	if err := os.Remove(filepath.Join(dir, preparingFile)); err != nil {
		return "", err
	}
	return path, nil
}

// writeSecret writes value to path, readable by the node's user alone: to a fresh file
// beside it (made with O_EXCL: nothing planted there is followed, and two writers never
// share one), then renamed over it.
func writeSecret(path, value string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// supervise runs instance i of m until ctx ends, restarting it with back-off.
func (s *Supervisor) supervise(ctx context.Context, m *module, i int, path string) {
	in := m.insts[i]
	quick := 0
	for {
		started := time.Now()
		err := s.runOnce(ctx, m, in, i, path)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errStart) {
			// Its files cannot be run (the artifact deleted or damaged on disk): fetched
			// again before the next start, which would fail the same way.
			if p, perr := s.restartFiles(ctx, m); perr == nil {
				path = p
			} else {
				err = fmt.Errorf("%w; preparing it again: %w", err, perr)
			}
		}
		reason := "exited"
		if err != nil {
			reason = err.Error()
		}
		if time.Since(started) < StableAfter {
			quick++
		} else {
			quick = 0
		}
		state := StateWaiting
		if quick >= CrashLoopAfter {
			state = StateCrashLooping
		}
		m.mu.Lock()
		in.pid, in.state, in.reason, in.since = 0, state, reason, time.Now().UTC()
		in.restarts++
		m.mu.Unlock()
		s.set(m, state, fmt.Sprintf("instance %d: %s", i, reason))
		s.log().Warn("module process exited; restarting", "module", m.spec.Module, "instance", i, "reason", reason, "restarts", in.restarts, "state", state)
		wait := min(time.Second<<min(quick, 6), MaxRestartWait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// runOnce starts one process of the module, sandboxed, and waits for it to exit, or stops
// it when ctx ends: SIGTERM to its process group, then everything in its cgroup is killed
// after the grace period.
func (s *Supervisor) runOnce(ctx context.Context, m *module, in *instance, i int, path string) error {
	dir := filepath.Dir(path)
	u, err := s.user(m.spec.Module)
	if err != nil {
		return err
	}
	work, err := s.workDir(dir, u)
	if err != nil {
		return fmt.Errorf("its working directory: %w", err)
	}
	env := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + work,
		"TMPDIR=" + filepath.Join(work, "tmp"),
		"MESH_URL=" + s.URL,
		"MESH_CREDS=" + filepath.Join(dir, "creds.nk"),
		"MESH_NODE=" + s.Node,
		"MESH_MODULE=" + m.spec.Module, // sdk.Connect then needs one connection, not two
		"MESH_SECRETS=" + filepath.Join(dir, "secrets"),
		"MESH_INSTANCE=" + strconv.Itoa(i),
	}
	read := []string{filepath.Join(dir, "creds.nk"), filepath.Join(dir, "secrets")}
	if s.CA != "" {
		ca, err := placeCA(s.CA, dir)
		if err != nil {
			return fmt.Errorf("the mesh's CA: %w", err)
		}
		env = append(env, "MESH_CA="+ca)
		read = append(read, ca)
	}
	provisioned, err := provisionEnv(dir)
	if err != nil {
		return fmt.Errorf("provisioned credentials: %w", err)
	}
	env = append(env, provisioned...)
	// The operator's environment comes last: it wins over a provider's variable of the
	// same name (exec uses the last).
	for _, k := range slices.Sorted(maps.Keys(m.spec.Env)) {
		env = append(env, k+"="+m.spec.Env[k])
	}
	if s.Sandbox == nil {
		return errors.New("the node has no sandbox to run it in")
	}
	// Through a pipe, so the log rotates while the process runs; what holds the pipe after
	// the process ended is not waited for past a second.
	p, err := s.Sandbox.Start(sandbox.Proc{
		Name: m.spec.Module + "." + strconv.Itoa(i), Path: path, Args: m.spec.Args, Env: env, Dir: work,
		Read: read, Write: []string{work}, User: u, Limits: s.limits(m.spec.Limits), DiskDir: work,
		Stdout: m.out, Stderr: m.out, WaitDelay: time.Second,
	})
	if errors.Is(err, sandbox.ErrExec) {
		return fmt.Errorf("%w: %w", errStart, err)
	}
	if err != nil {
		return fmt.Errorf("not started: %w", err)
	}
	m.mu.Lock()
	in.proc, in.pid, in.state, in.since = p, p.Pid, StateRunning, time.Now().UTC()
	m.mu.Unlock()
	s.set(m, StateRunning, "")
	defer func() {
		m.mu.Lock()
		in.proc = nil
		m.mu.Unlock()
	}()
	exited := make(chan error, 1)
	go func() { exited <- p.Wait() }() // what it started ends with it: its cgroup is killed
	select {
	case err := <-exited:
		if cause := p.Cause(); cause != "" {
			return errors.New(cause)
		}
		if errors.Is(err, exec.ErrWaitDelay) && p.ProcessState() != nil {
			// It exited while a child still held its output: its own status is the reason.
			err = nil
			if !p.ProcessState().Success() {
				err = &exec.ExitError{ProcessState: p.ProcessState()}
			}
		}
		return exitReason(err)
	case <-ctx.Done():
	}
	p.Signal(syscall.SIGTERM)
	grace := s.Grace
	if grace == 0 {
		grace = DefaultGrace
	}
	select {
	case <-exited:
	case <-time.After(grace):
		p.Kill()
		<-exited
	}
	return nil
}

// errStart is a process that could not be started at all.
var errStart = errors.New("start")

// restartFiles prepares m's files again, its artifact fetched anew, after a start failed.
func (s *Supervisor) restartFiles(ctx context.Context, m *module) (string, error) {
	m.prepMu.Lock()
	defer m.prepMu.Unlock()
	if path, ok := s.onDisk(m.spec); ok {
		return path, nil // another instance did it, or the failure was not the files'
	}
	path, err := s.prepare(ctx, m.spec) // a damaged artifact is fetched again
	if err != nil {
		return "", err
	}
	return path, s.own(m.spec.Module) // its seed and secrets written anew: its user's again
}

// exitReason says how a process ended.
func exitReason(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Errorf("killed by %s", ws.Signal())
		}
		return fmt.Errorf("exit status %d", ee.ExitCode())
	}
	if err == nil {
		return errors.New("exit status 0")
	}
	return err
}
