package host_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sandbox"
	"github.com/nats-io/nkeys"
)

// supervisor runs artifacts given as scripts, with a fresh module identity, in dir.
func supervisor(t *testing.T, scripts map[string]string) (*host.Supervisor, func(module string) deploy.Module) {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	root := t.TempDir()
	sb, users := openSandbox(t, root)
	s := &host.Supervisor{
		Sandbox: sb, Users: users,
		Dir:   filepath.Join(root, "modules"),
		Node:  "alpha",
		URL:   "nats://127.0.0.1:1",
		Grace: 300 * time.Millisecond,
		Artifact: func(_ context.Context, m deploy.Module, w io.Writer) error {
			_, err := io.WriteString(w, scripts[m.Module])
			return err
		},
		Credentials: func(_ context.Context, m deploy.Module) (*api.ModuleCredentials, error) {
			return &api.ModuleCredentials{Module: m.Module, PublicKey: pub, Seed: string(seed), Secrets: map[string]string{"token": "s3cret"}}, nil
		},
	}
	t.Cleanup(s.Stop)
	spec := func(module string) deploy.Module {
		sum := sha256.Sum256([]byte(scripts[module]))
		return deploy.Module{Module: module, PublicKey: pub, Version: "1", Digest: "sha256:" + hex.EncodeToString(sum[:]), Instances: 1, Secrets: []string{"token"}}
	}
	return s, spec
}

// waitFor polls the supervisor's report until ok says yes.
func waitFor(t *testing.T, s *host.Supervisor, timeout time.Duration, ok func(host.Report) error) host.Report {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := s.Report()
		err := ok(r)
		if err == nil {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid runs: not gone, and not a zombie waiting for its reaper (a killed
// child whose parent died first waits for init, which in a container may never reap it).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis: "pid (comm) S …".
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// TestSupervisor_StopKillsTheGroup: a process that ignores SIGTERM, and the child it started,
// are killed when the grace period ends; the stopped module's directory, with its
// credentials and secrets, is deleted.
func TestSupervisor_StopKillsTheGroup(t *testing.T) {
	stubborn := "#!/bin/sh\ntrap '' TERM\nsleep 600 &\necho $! > child.pid\necho \"secret: $(cat \"$MESH_SECRETS/token\")\"\nwait\n"
	s, spec := supervisor(t, map[string]string{"stubborn": stubborn})
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("stubborn")}})
	dir := filepath.Join(s.Dir, "stubborn")
	var child int
	r := waitFor(t, s, 10*time.Second, func(r host.Report) error {
		if len(r.Modules) != 1 || r.Modules[0].State != host.StateRunning || len(r.Modules[0].Instances) != 1 || r.Modules[0].Instances[0].PID == 0 {
			return fmt.Errorf("report %+v", r)
		}
		b, err := os.ReadFile(filepath.Join(dir, "work", "child.pid"))
		if err != nil {
			return err
		}
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	parent := r.Modules[0].Instances[0].PID
	want := os.FileMode(0o600) // the node's user's, and so the module's
	if os.Geteuid() == 0 {
		want = 0o400 // the module's own uid's
	}
	for _, f := range []string{"creds.nk", "secrets/token"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want a %o file", f, st, err, want)
		}
	}
	start := time.Now()
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 2})
	if alive(parent) {
		t.Fatalf("after the stop: parent %d alive", parent)
	}
	// The group's SIGKILL is sent when Apply returns; the kernel ends the child just after.
	deadline := time.Now().Add(2 * time.Second)
	for alive(child) {
		if time.Now().After(deadline) {
			t.Fatalf("after the stop: the child %d, in the module's process group, still runs", child)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("stopped in %s: the SIGTERM it ignores cannot have stopped it before the grace period", took)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the module's directory is still there: %v", err)
	}
}

// TestSupervisor_CrashLoop: a process that exits at once is started again with a growing
// back-off and reported crash-looping, with its exit status and restarts.
func TestSupervisor_CrashLoop(t *testing.T) {
	s, spec := supervisor(t, map[string]string{"broken": "#!/bin/sh\necho failing\nexit 3\n"})
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("broken")}})
	r := waitFor(t, s, 20*time.Second, func(r host.Report) error {
		if len(r.Modules) != 1 || r.Modules[0].State != host.StateCrashLooping {
			return fmt.Errorf("report %+v", r)
		}
		return nil
	})
	in := r.Modules[0].Instances[0]
	if in.Restarts < host.CrashLoopAfter || in.Reason != "exit status 3" || in.PID != 0 {
		t.Fatalf("instance %+v", in)
	}
}

// TestSupervisor_BadArtifact: an artifact that cannot be fetched (a digest mismatch) leaves
// the module failed with the reason, and nothing runs.
func TestSupervisor_BadArtifact(t *testing.T) {
	s, spec := supervisor(t, map[string]string{"ok": "#!/bin/sh\nexec sleep 600\n"})
	s.Artifact = func(context.Context, deploy.Module, io.Writer) error { return errors.New("artifact digest mismatch") }
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("ok")}})
	r := waitFor(t, s, 5*time.Second, func(r host.Report) error {
		if len(r.Modules) != 1 || r.Modules[0].State != host.StateFailed || !strings.Contains(r.Modules[0].Reason, "digest") {
			return fmt.Errorf("report %+v", r)
		}
		return nil
	})
	if len(r.Modules[0].Instances) != 0 {
		t.Fatalf("instances %+v, want none", r.Modules[0].Instances)
	}
}

// TestSupervisor_ExitKillsTheGroup: a process that exits on its own takes what it started in
// its process group with it; restarts do not pile up copies that outlive an undeploy.
func TestSupervisor_ExitKillsTheGroup(t *testing.T) {
	leaver := "#!/bin/sh\nsleep 600 &\necho $! >> children.pid\nexit 0\n"
	s, spec := supervisor(t, map[string]string{"leaver": leaver})
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("leaver")}})
	dir := filepath.Join(s.Dir, "leaver")
	var children []int
	waitFor(t, s, 20*time.Second, func(r host.Report) error {
		b, err := os.ReadFile(filepath.Join(dir, "work", "children.pid"))
		if err != nil {
			return err
		}
		children = children[:0]
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				return err
			}
			children = append(children, pid)
		}
		if len(children) < 2 || len(r.Modules) != 1 || len(r.Modules[0].Instances) != 1 || r.Modules[0].Instances[0].Restarts < 1 {
			return fmt.Errorf("%d children started, report %+v", len(children), r)
		}
		// The reason is its own exit status, though its child held its output past it.
		if got := r.Modules[0].Instances[0].Reason; got != "exit status 0" {
			t.Fatalf("the exit's reason is %q, want exit status 0", got)
		}
		return nil
	})
	// Every start's child but perhaps the latest's (its parent may be exiting now) is gone.
	deadline := time.Now().Add(2 * time.Second)
	for _, child := range children[:len(children)-1] {
		for alive(child) {
			if time.Now().After(deadline) {
				t.Fatalf("child %d of an exited process still runs", child)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestSupervisor_ResumeEndsWhatWasLeft: a node killed with kill -9 leaves its modules'
// processes running and, during an undeploy, a module's directory with its seed. Resume
// kills the processes — a module never runs twice with the same credentials — and removes
// the directory of a module the declaration no longer names.
func TestSupervisor_ResumeEndsWhatWasLeft(t *testing.T) {
	s, spec := supervisor(t, map[string]string{"kept": "#!/bin/sh\nexec sleep 600\n"})
	leftover := func(module string) <-chan error {
		dir := filepath.Join(s.Dir, module)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "creds.nk"), []byte("SU…"), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sleep", "600")
		cmd.Dir = dir
		cmd.Env = []string{"MESH_CREDS=" + filepath.Join(dir, "creds.nk")}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited, done := make(chan error, 1), make(chan struct{})
		go func() {
			exited <- cmd.Wait()
			close(done)
		}()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
		return exited
	}
	gone, kept := leftover("gone"), leftover("kept")
	// A process whose environment does not match is left alone, and so is one that has the
	// variable but runs elsewhere (an operator's shell running a module by hand).
	bystanders := []*exec.Cmd{exec.Command("sleep", "600"), exec.Command("sleep", "600")}
	bystanders[0].Env = []string{"MESH_CREDS=" + filepath.Join(t.TempDir(), "gone", "creds.nk")}
	bystanders[1].Env = []string{"MESH_CREDS=" + filepath.Join(s.Dir, "gone", "creds.nk")}
	bystanders[1].SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	for _, b := range bystanders {
		if err := b.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Process.Kill(); b.Wait() })
	}

	s.Resume(context.Background(), deploy.Declaration{Node: "alpha", Revision: 3, Modules: []deploy.Module{spec("kept")}})
	for name, exited := range map[string]<-chan error{"gone": gone, "kept": kept} {
		select {
		case err := <-exited:
			if err == nil {
				t.Fatalf("the leftover process of %s exited by itself, not killed", name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the leftover process of %s still runs after Resume", name)
		}
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the undeclared module's directory is still there: %v", err)
	}
	for i, b := range bystanders {
		if !alive(b.Process.Pid) {
			t.Fatalf("bystander %d (not a module's process) was killed", i)
		}
	}
	waitFor(t, s, 10*time.Second, func(r host.Report) error {
		if len(r.Modules) != 1 || r.Modules[0].Module != "kept" || r.Modules[0].State != host.StateRunning || r.Modules[0].Instances[0].PID == 0 {
			return fmt.Errorf("report %+v", r)
		}
		return nil
	})
}

// TestSupervisor_ApplyStopsAtOnce: the modules a declaration drops are all told to stop
// before any is waited for, so N that use their whole grace period take one period, not N
// (while Apply holds the supervisor, reports wait).
func TestSupervisor_ApplyStopsAtOnce(t *testing.T) {
	stubborn := "#!/bin/sh\ntrap 'touch termed' TERM\ntouch ready\nwhile :; do sleep 1; done\n"
	s, spec := supervisor(t, map[string]string{"a-stub": stubborn, "b-stub": stubborn})
	s.Grace = 5 * time.Second
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("a-stub"), spec("b-stub")}})
	r := waitFor(t, s, 10*time.Second, func(r host.Report) error {
		for _, m := range r.Modules {
			if m.State != host.StateRunning || len(m.Instances) != 1 || m.Instances[0].PID == 0 {
				return fmt.Errorf("report %+v", r)
			}
		}
		if len(r.Modules) != 2 {
			return fmt.Errorf("report %+v", r)
		}
		for _, m := range r.Modules { // its trap is set: a SIGTERM before it would end it at once
			if _, err := os.Stat(filepath.Join(s.Dir, m.Module, "work", "ready")); err != nil {
				return err
			}
		}
		return nil
	})
	first := r.Modules[0].Instances[0].PID // a-stub's: stopped first
	applied := make(chan struct{})
	go func() {
		s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 2})
		close(applied)
	}()
	termed := func(module string) bool {
		_, err := os.Stat(filepath.Join(s.Dir, module, "work", "termed"))
		return err == nil
	}
	deadline := time.Now().Add(s.Grace) // a-stub's grace: it is killed then, and its directory removed
	for !(termed("a-stub") && termed("b-stub")) {
		if !alive(first) || time.Now().After(deadline) {
			t.Fatalf("b-stub was not told to stop while a-stub (pid %d) used its grace period (a termed %v, b termed %v)", first, termed("a-stub"), termed("b-stub"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	<-applied
}

// runningPID waits until module runs one process other than notPID and returns its pid.
func runningPID(t *testing.T, s *host.Supervisor, module string, notPID int) int {
	t.Helper()
	r := waitFor(t, s, 20*time.Second, func(r host.Report) error {
		if len(r.Modules) != 1 || r.Modules[0].Module != module || r.Modules[0].State != host.StateRunning ||
			len(r.Modules[0].Instances) != 1 || r.Modules[0].Instances[0].PID == 0 || r.Modules[0].Instances[0].PID == notPID {
			return fmt.Errorf("report %+v", r)
		}
		return nil
	})
	return r.Modules[0].Instances[0].PID
}

// TestSupervisor_DamagedFilesAreFetchedAgain: an artifact deleted while its module runs is
// fetched again when the next start fails, and one damaged on disk while the node was down
// is not run at the next start but fetched again (its digest is checked, not only its
// presence).
func TestSupervisor_DamagedFilesAreFetchedAgain(t *testing.T) {
	// It must read its seed at each start: prepared again, the seed is still its user's.
	script := "#!/bin/sh\ncat \"$MESH_CREDS\" >/dev/null || exit 7\ntouch read-by-$$\nexec sleep 600\n"
	s, spec := supervisor(t, map[string]string{"ok": script})
	d := deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("ok")}}
	s.Apply(context.Background(), d)
	pid := runningPID(t, s, "ok", 0)
	artifacts, _ := filepath.Glob(filepath.Join(s.Dir, "ok", "artifact-*"))
	if len(artifacts) != 1 {
		t.Fatalf("artifacts %v", artifacts)
	}
	if err := os.Remove(artifacts[0]); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	pid = runningPID(t, s, "ok", pid)
	waitFor(t, s, 10*time.Second, func(host.Report) error { // it read its seed, prepared anew
		_, err := os.Stat(filepath.Join(s.Dir, "ok", "work", fmt.Sprintf("read-by-%d", pid)))
		return err
	})

	s.Stop()
	if err := os.WriteFile(artifacts[0], []byte("#!/bin/sh\necho tampered\nexec sleep 600\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	s.Resume(context.Background(), d)
	runningPID(t, s, "ok", pid)
	if b, err := os.ReadFile(artifacts[0]); err != nil || string(b) != script {
		t.Fatalf("the artifact on disk is %q (%v), want the one its digest names", b, err)
	}
}

// TestSupervisor_ResumeFromAnOlderVersionsFiles: a module directory an earlier version
// prepared (no markers) starts from disk without the bus when its files check out; one whose
// preparation was cut short (the preparing marker left) is prepared again.
func TestSupervisor_ResumeFromAnOlderVersionsFiles(t *testing.T) {
	s, spec := supervisor(t, map[string]string{"ok": "#!/bin/sh\nexec sleep 600\n"})
	d := deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("ok")}}
	s.Apply(context.Background(), d)
	pid := runningPID(t, s, "ok", 0)
	s.Stop()
	var asked atomic.Int32
	credentials := s.Credentials
	s.Credentials = func(ctx context.Context, m deploy.Module) (*api.ModuleCredentials, error) {
		asked.Add(1)
		return credentials(ctx, m)
	}
	dir := filepath.Join(s.Dir, "ok")
	if err := os.Remove(filepath.Join(dir, "prepared")); err != nil {
		t.Fatal(err)
	}
	s.Resume(context.Background(), d)
	pid = runningPID(t, s, "ok", pid)
	if n := asked.Load(); n != 0 {
		t.Fatalf("an older version's complete files were prepared again (%d credential requests)", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "prepared")); err != nil {
		t.Fatalf("the files checked out, and no marker was written: %v", err)
	}
	s.Stop()
	if err := os.WriteFile(filepath.Join(dir, "preparing"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s.Resume(context.Background(), d)
	runningPID(t, s, "ok", pid)
	if n := asked.Load(); n != 1 {
		t.Fatalf("a preparation cut short was not prepared again (%d credential requests)", n)
	}
}

// TestSupervisor_SecretsReplacedInPlace: preparing a module again writes the secrets it is
// given over the old ones and removes those no longer given.
func TestSupervisor_SecretsReplacedInPlace(t *testing.T) {
	s, spec := supervisor(t, map[string]string{"ok": "#!/bin/sh\nexec sleep 600\n"})
	given := func(secrets map[string]string) {
		credentials := s.Credentials
		s.Credentials = func(ctx context.Context, m deploy.Module) (*api.ModuleCredentials, error) {
			c, err := credentials(ctx, m)
			if err == nil {
				c.Secrets = secrets
			}
			return c, err
		}
	}
	given(map[string]string{"token": "one", "old": "x"})
	first := spec("ok")
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{first}})
	pid := runningPID(t, s, "ok", 0)
	given(map[string]string{"token": "two"})
	second := first
	second.Env = map[string]string{"CHANGED": "1"} // another spec: prepared again
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 2, Modules: []deploy.Module{second}})
	runningPID(t, s, "ok", pid)
	dir := filepath.Join(s.Dir, "ok", "secrets")
	if b, err := os.ReadFile(filepath.Join(dir, "token")); err != nil || string(b) != "two" {
		t.Fatalf("secrets/token = %q, %v; want two", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "old")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("secrets/old, no longer given, is still there: %v", err)
	}
}

// TestSupervisor_LimitsEndAndReport: an instance past its manifest's limits — a fork bomb
// past processes, a writer past disk, a hog past memory — is ended, and the report says why;
// it is restarted with back-off as a crash is, and the node's defaults apply where the
// manifest sets no limit.
func TestSupervisor_LimitsEndAndReport(t *testing.T) {
	s, spec := supervisor(t, map[string]string{
		"bomb":   "#!/bin/sh\nb() { b | b & }\nb\nexec sleep 600\n",
		"filler": "#!/bin/sh\nwhile :; do head -c 1048576 /dev/zero >> fill; done\n",
		"hog":    "#!/bin/sh\nx=a; while :; do x=\"$x$x\"; done\n",
		"greedy": "#!/bin/sh\nexec sleep 600\n",
	})
	s.Limits = api.Limits{Processes: 32} // the node's default: the bomb's own is below
	bomb, filler, hog := spec("bomb"), spec("filler"), spec("hog")
	bomb.Limits = manifest.Limits{Processes: 16}
	filler.Limits = manifest.Limits{Disk: 4 << 20}
	hog.Limits = manifest.Limits{Memory: 32 << 20}
	greedy := spec("greedy") // asks for more than the node gives any module
	greedy.Limits = manifest.Limits{Processes: 1 << 20}
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{bomb, filler, greedy, hog}})
	waitFor(t, s, 10*time.Second, func(r host.Report) error {
		for _, m := range r.Modules {
			if m.Module == "greedy" && len(m.Instances) == 1 && m.Instances[0].Isolation != nil {
				if got := m.Instances[0].Isolation.Limits.Processes; got != 32 {
					t.Fatalf("greedy's processes limit is %d, want the node's 32", got)
				}
				return nil
			}
		}
		return fmt.Errorf("greedy does not run: %+v", r)
	})
	want := map[string]string{"bomb": sandbox.CauseForks, "filler": sandbox.CauseDisk, "hog": sandbox.CauseOOM, "greedy": ""}
	r := waitFor(t, s, 30*time.Second, func(r host.Report) error {
		for _, m := range r.Modules {
			if m.Module == "greedy" {
				continue
			}
			if len(m.Instances) != 1 || m.Instances[0].Reason != want[m.Module] {
				return fmt.Errorf("%s: %+v, want the reason %q", m.Module, m.Instances, want[m.Module])
			}
		}
		return nil
	})
	for _, m := range r.Modules {
		if m.Module != "greedy" && m.Instances[0].Restarts < 1 {
			t.Errorf("%s was not restarted: %+v", m.Module, m.Instances[0])
		}
	}
}

// TestSupervisor_PlantedLinksAreNotFollowed: a module replaces what it may in its own work
// directory with links to a file of the node's (its tmp, files the disk check walks) and
// tries to plant them beside its seed and output log; restarted, the node follows none of
// them: the node's file keeps its owner and mode, and the module's directory is as the node
// made it.
func TestSupervisor_PlantedLinksAreNotFollowed(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "node-secret")
	if err := os.WriteFile(outside, []byte("SUNODE"), 0o600); err != nil {
		t.Fatal(err)
	}
	planter := "#!/bin/sh\nrm -rf tmp; ln -s " + outside + " tmp\nln -s / root\nln -s " + outside + " fill\n" +
		"ln -sf " + outside + " ../output.log 2>/dev/null && echo planted-log\nln -s " + outside + " ../secrets/x 2>/dev/null && echo planted-secret\n" +
		"rm -f ../creds.nk 2>/dev/null && echo removed-creds\nsleep 1\nexit 1\n"
	s, spec := supervisor(t, map[string]string{"planter": planter})
	s.Limits = api.Limits{Disk: 1 << 20}
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("planter")}})
	waitFor(t, s, 30*time.Second, func(r host.Report) error {
		if len(r.Modules) != 1 || len(r.Modules[0].Instances) != 1 || r.Modules[0].Instances[0].Restarts < 2 {
			return fmt.Errorf("report %+v", r)
		}
		return nil
	})
	st, err := os.Stat(outside)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); st.Mode().Perm() != 0o600 || int(sys.Uid) != os.Geteuid() {
		t.Fatalf("the node's file is now %v, uid %d", st.Mode(), sys.Uid)
	}
	dir := filepath.Join(s.Dir, "planter")
	for _, name := range []string{"output.log", "creds.nk"} {
		if st, err := os.Lstat(filepath.Join(dir, name)); err != nil || !st.Mode().IsRegular() {
			t.Fatalf("%s: %v %v, want the node's own file", name, st, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "secrets", "x")); err == nil {
		t.Fatal("a link was planted among its secrets")
	}
	log, _ := os.ReadFile(filepath.Join(dir, "output.log"))
	if strings.Contains(string(log), "planted") || strings.Contains(string(log), "removed-creds") || strings.Contains(string(log), "SUNODE") {
		t.Fatalf("the module wrote outside its work directory:\n%s", log)
	}
}

// TestSupervisor_RefusedWithoutIsolation: a node whose machine cannot give full isolation
// (here: no cgroup it may write) and that was not told `isolation: reduced` starts no
// module, and the report says why and what to do.
func TestSupervisor_RefusedWithoutIsolation(t *testing.T) {
	s, spec := supervisor(t, map[string]string{"m": "#!/bin/sh\nexec sleep 600\n"})
	sb, err := sandbox.Open(sandbox.Config{Name: "refused", Cgroup: filepath.Join(t.TempDir(), "not-a-cgroup")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	s.Sandbox = sb
	s.Apply(context.Background(), deploy.Declaration{Node: "alpha", Revision: 1, Modules: []deploy.Module{spec("m")}})
	waitFor(t, s, 10*time.Second, func(r host.Report) error {
		if len(r.Modules) != 1 || len(r.Modules[0].Instances) != 1 {
			return fmt.Errorf("report %+v", r)
		}
		in := r.Modules[0].Instances[0]
		if in.PID != 0 || !strings.Contains(in.Reason, "full isolation is not available") || !strings.Contains(in.Reason, "isolation: reduced") {
			return fmt.Errorf("instance %+v, want it refused with the reason", in)
		}
		return nil
	})
}
