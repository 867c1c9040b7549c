package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// LauncherArg is the launcher's argv[1]: `<node binary> sandbox-exec <launch JSON>`.
const LauncherArg = "sandbox-exec"

// reportFD is the launcher's end of the pipe to the node (ExtraFiles[0]); it closes on exec.
const reportFD = 3

// launcherFailed is the launcher's exit status when it could not start the program.
const launcherFailed = 125

// launch is what the node tells its launcher.
type launch struct {
	Path string   `json:"path"`
	Args []string `json:"args"` // argv, program name first
	Dir  string   `json:"dir"`
	UID  int      `json:"uid"` // -1: the node's
	GID  int      `json:"gid"`
	// Join are cgroup v1 cgroup.procs files the launcher writes its pid to while it still
	// may (before it drops to UID): v1 limits for a process that v2 groups.
	Join []string `json:"join,omitempty"`
	// Landlock asks for the ruleset below; without it only no_new_privs is set.
	Landlock bool     `json:"landlock"`
	Read     []string `json:"read,omitempty"`  // read and execute, beneath each
	Write    []string `json:"write,omitempty"` // read, write, create, remove, beneath each
	// FileSize bounds each file the process writes (RLIMIT_FSIZE, bytes; 0: none).
	FileSize int64 `json:"file_size,omitempty"`
	// Tasks bounds the processes and threads its uid may have more than it has now
	// (RLIMIT_NPROC, which counts the uid's, not the process's): where no pids controller
	// holds a fork bomb, the kernel still refuses its forks. 0: none.
	Tasks int `json:"tasks,omitempty"`
}

// Launcher runs the launcher when this process was started as one (argv[1] is LauncherArg),
// and never returns then; otherwise it returns at once. A binary that starts sandboxed
// processes calls it first thing in main (and a test binary in TestMain), since the node
// starts its own executable as the launcher.
func Launcher() {
	if len(os.Args) < 3 || os.Args[1] != LauncherArg {
		return
	}
	report := os.NewFile(reportFD, "report")
	syscall.CloseOnExec(reportFD)
	var l launch
	if err := json.Unmarshal([]byte(os.Args[2]), &l); err != nil {
		fail(report, fmt.Errorf("read the launch: %w", err))
	}
	applied, err := l.apply()
	if err != nil {
		fail(report, err)
	}
	fmt.Fprintf(report, "ok %s\n", applied)
	err = syscall.Exec(l.Path, l.Args, os.Environ())
	// "exec": the program could not be run (missing, not executable), and the node's
	// supervisor fetches its artifact again; "error": anything else.
	fmt.Fprintf(report, "exec %s: %s\n", l.Path, err)
	os.Exit(launcherFailed)
}

func fail(report *os.File, err error) {
	fmt.Fprintf(report, "error %s\n", err)
	os.Exit(launcherFailed)
}

// apply sets up everything but the exec, on the thread that will exec (Landlock and
// no_new_privs are a thread's until exec makes them the program's), and returns the
// Landlock ABI it applied ("abi N", or "none").
func (l launch) apply() (string, error) {
	runtime.LockOSThread() // never unlocked: this thread execs
	pid := strconv.Itoa(os.Getpid())
	for _, procs := range l.Join {
		if err := os.WriteFile(procs, []byte(pid), 0); err != nil {
			return "", fmt.Errorf("join cgroup %s: %w", procs, err)
		}
	}
	if err := os.Chdir(l.Dir); err != nil {
		return "", fmt.Errorf("enter %s: %w", l.Dir, err)
	}
	if os.Geteuid() == 0 {
		// No capability survives, even in the bounding set: a later exec of a file with
		// capabilities, or of a setuid one, gains none (no_new_privs holds the rest).
		if err := dropCapabilities(); err != nil {
			return "", fmt.Errorf("drop capabilities: %w", err)
		}
	}
	if l.UID >= 0 {
		// Go applies these to every thread; after the last one no uid is 0, so the
		// kernel clears every capability.
		if err := syscall.Setgroups(nil); err != nil {
			return "", fmt.Errorf("drop supplementary groups: %w", err)
		}
		if err := syscall.Setresgid(l.GID, l.GID, l.GID); err != nil {
			return "", fmt.Errorf("become gid %d: %w", l.GID, err)
		}
		if err := syscall.Setresuid(l.UID, l.UID, l.UID); err != nil {
			return "", fmt.Errorf("become uid %d: %w", l.UID, err)
		}
	}
	if l.Tasks > 0 {
		n := uint64(uidTasks(os.Getuid()) + l.Tasks)
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return "", fmt.Errorf("limit processes: %w", err)
		}
	}
	if l.FileSize > 0 {
		lim := unix.Rlimit{Cur: uint64(l.FileSize), Max: uint64(l.FileSize)}
		if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
			return "", fmt.Errorf("limit file size: %w", err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return "", fmt.Errorf("set no_new_privs: %w", err)
	}
	if !l.Landlock {
		return "none", nil
	}
	abi, err := ll.LandlockGetABIVersion()
	if err != nil || abi < 1 {
		return "", fmt.Errorf("landlock: not available in this kernel (%v)", err)
	}
	fd, _, err := l.ruleset()
	if err != nil {
		return "", fmt.Errorf("landlock ruleset: %w", err)
	}
	// This thread alone: it is the one that execs, and the program starts with the
	// thread's domain. (go-landlock's Restrict would apply it to every thread.)
	if err := ll.LandlockRestrictSelf(fd, 0); err != nil {
		return "", fmt.Errorf("landlock_restrict_self: %w", err)
	}
	unix.Close(fd)
	return "abi " + strconv.Itoa(min(abi, maxABI)), nil
}

// maxABI is the newest Landlock ABI whose rights the ruleset handles (go-landlock's newest).
const maxABI = 11

// ruleset is the launch's Landlock ruleset: every filesystem right the kernel knows is
// handled, and granted beneath Read (read, execute) and Write (all but refer and device
// ioctls); signals and abstract sockets are scoped to the domain. The network is not
// handled: a module reaches its bus over TCP (docs/isolation.md says what else it can).
func (l launch) ruleset() (int, uint32, error) {
	cfg := landlock.Config{HandledAccessFS: landlock.V11.HandledAccessFS, Scoped: landlock.V11.Scoped}.BestEffort()
	var rules []landlock.Rule
	for _, p := range l.Read {
		rules = append(rules, pathRule(p, false))
	}
	for _, p := range l.Write {
		rules = append(rules, pathRule(p, true))
	}
	return cfg.NewRulesetFD(rules...)
}

// pathRule grants read (and execute), or read and write, beneath p: a directory's rights
// for a directory, a file's for anything else. A path that is not there is skipped.
func pathRule(p string, write bool) landlock.Rule {
	st, err := os.Stat(p)
	dir := err == nil && st.IsDir()
	switch {
	case dir && write:
		// Refer: moving a file between its own directories (TMPDIR into work/) is a
		// rename across directories, which Landlock refuses without it.
		return landlock.RWDirs(p).WithRefer().IgnoreIfMissing()
	case dir:
		return landlock.RODirs(p).IgnoreIfMissing()
	case write:
		return landlock.RWFiles(p).IgnoreIfMissing()
	default:
		return landlock.ROFiles(p).IgnoreIfMissing()
	}
}

// dropCapabilities empties this thread's capability bounding set (so no exec grants one,
// whatever the file) and its ambient set. The effective and permitted sets stay until the
// uid changes, which clears them: the change itself needs CAP_SETUID.
func dropCapabilities() error {
	last := 40
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("bounding set, capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("ambient set: %w", err)
	}
	return nil
}

// uidTasks counts the tasks (threads) that processes of uid have now, as RLIMIT_NPROC does.
func uidTasks(uid int) int {
	n := 0
	for _, st := range processes() {
		if st.uid == uid {
			n += st.threads
		}
	}
	return n
}
