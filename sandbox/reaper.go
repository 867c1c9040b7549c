package sandbox

import (
	"iter"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reaper makes the node a child subreaper where it has no cgroup to group a module's
// processes: a process that leaves its parent (setsid and a double fork) is reparented to
// the node instead of init, and the reaper ends it. It ends and reaps only processes that
// the node did not start itself (not known) and that carry a launcher's no_new_privs, so
// os/exec keeps the exit statuses of the node's own children.
type reaper struct {
	log  *slog.Logger
	sigs chan os.Signal
	quit chan struct{}
	done chan struct{}

	mu    sync.Mutex
	known map[int]bool // pids the sandbox started
}

func startReaper(log *slog.Logger) (*reaper, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, err
	}
	r := &reaper{log: log, sigs: make(chan os.Signal, 1), quit: make(chan struct{}), done: make(chan struct{}), known: map[int]bool{}}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	go r.run()
	return r, nil
}

func (r *reaper) stop() {
	signal.Stop(r.sigs)
	close(r.quit)
	<-r.done
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
}

func (r *reaper) run() {
	defer close(r.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-r.sigs:
		case <-t.C:
		}
		r.reap()
	}
}

// reap ends and waits for the orphans the node inherited.
func (r *reaper) reap() {
	self := os.Getpid()
	selfNNP := false
	if st, ok := procStatus("self"); ok {
		selfNNP = st.noNewPrivs
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range children(self) {
		if r.known[pid] {
			continue
		}
		st, ok := procStatus(strconv.Itoa(pid))
		if !ok || !st.noNewPrivs || (selfNNP && st.pgid == syscall.Getpgrp()) {
			continue // one of the node's own children
		}
		syscall.Kill(pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
		r.log.Warn("ended a process a module left behind", "pid", pid)
	}
}

// children are the pids whose parent is ppid.
func children(ppid int) []int {
	var kids []int
	for pid, st := range processes() {
		if st.ppid == ppid {
			kids = append(kids, pid)
		}
	}
	return kids
}

// killDescendants SIGKILLs every descendant of pid, repeatedly until none is found.
func killDescendants(pid int) {
	for range 20 {
		found := false
		tree := map[int][]int{}
		for p, st := range processes() {
			tree[st.ppid] = append(tree[st.ppid], p)
		}
		queue := append([]int{}, tree[pid]...)
		for len(queue) > 0 {
			p := queue[0]
			queue = append(queue[1:], tree[p]...)
			syscall.Kill(p, syscall.SIGKILL)
			found = true
		}
		if !found {
			return
		}
	}
}

// processes yields every process of the machine with its status; one gone meanwhile is
// skipped.
func processes() iter.Seq2[int, status] {
	return func(yield func(int, status) bool) {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if st, ok := procStatus(e.Name()); ok && !yield(pid, st) {
				return
			}
		}
	}
}

// status is what the sandbox reads of a process in /proc/<pid>/status.
type status struct {
	uid, ppid, pgid int
	threads         int
	noNewPrivs      bool
	capEff          string
}

// procStatus reads /proc/<pid>/status and the pgid from /proc/<pid>/stat.
func procStatus(pid string) (status, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return status{}, false
	}
	var st status
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "Uid":
			st.uid, _ = strconv.Atoi(f[0])
		case "PPid":
			st.ppid, _ = strconv.Atoi(f[0])
		case "Threads":
			st.threads, _ = strconv.Atoi(f[0])
		case "NoNewPrivs":
			st.noNewPrivs = f[0] == "1"
		case "CapEff":
			st.capEff = f[0]
		}
	}
	if stat, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil {
		// pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
			if f := strings.Fields(string(stat[i+1:])); len(f) > 2 {
				st.pgid, _ = strconv.Atoi(f[2])
			}
		}
	}
	return st, true
}
