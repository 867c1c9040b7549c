package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/api"
	"golang.org/x/sys/unix"
)

// The controllers a node limits a process with.
var controllers = []string{"memory", "pids", "cpu"}

// cgroups are the node's subtrees: a v2 one that groups (and limits, with the controllers
// it has), and v1 ones for the controllers v2 lacks (a hybrid mount, node as root).
type cgroups struct {
	v2     string          // the node's v2 subtree (absolute path); "" none
	v2Base string          // the v2 mount point
	v2Ctl  map[string]bool // controllers enabled for v2's leaves
	v1     map[string]string
}

// mounts finds the cgroup v2 mount point and each v1 controller's, from mountinfo.
func mounts() (v2 string, v1 map[string]string) {
	v1 = map[string]string{}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", v1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 3 || fields[3] != "/" {
			continue
		}
		switch tail[0] {
		case "cgroup2":
			if v2 == "" {
				v2 = fields[4]
			}
		case "cgroup":
			for _, opt := range strings.Split(tail[2], ",") {
				if slices.Contains(controllers, opt) {
					v1[opt] = fields[4]
				}
			}
		}
	}
	return v2, v1
}

// ownV2 is this process's cgroup in the v2 hierarchy, relative to its mount ("/" at the top).
func ownV2() string { return ownCgroup("") }

// ownCgroup is this process's cgroup in the hierarchy of controller ("" the v2 one),
// relative to its mount.
func ownCgroup(controller string) string {
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-id:controller-list:path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if (controller == "" && f[0] == "0" && f[1] == "") || (controller != "" && slices.Contains(strings.Split(f[1], ","), controller)) {
			return f[2]
		}
	}
	return "/"
}

// openCgroups makes the node's subtrees, named name, beneath parent (a v2 cgroup the node
// may write, relative to the mount or absolute; "" is the node's own cgroup). Failing
// that, it returns what it could make and why v2 is missing.
func openCgroups(parent, name string, root bool) (*cgroups, string) {
	v2, v1 := mounts()
	cg := &cgroups{v2Base: v2, v2Ctl: map[string]bool{}, v1: map[string]string{}}
	var missing string
	switch {
	case v2 == "":
		missing = "no cgroup v2 hierarchy is mounted"
	default:
		if parent == "" {
			// The node's own cgroup: where enableV2 moved the node into a leaf of its own
			// (a grow restarts the node in the same process), the one above it.
			parent = strings.TrimSuffix(ownV2(), "/"+selfLeaf)
		}
		if !strings.HasPrefix(parent, v2+"/") {
			parent = filepath.Join(v2, parent)
		}
		dir := filepath.Join(parent, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			missing = fmt.Sprintf("cannot make a cgroup in %s (%v): run the node as root, or give it a delegated cgroup (systemd Delegate=yes, or --cgroup)", parent, err)
			break
		}
		cg.v2 = dir
		cg.enableV2(parent)
	}
	if root {
		for _, c := range controllers {
			if cg.v2Ctl[c] || v1[c] == "" {
				continue
			}
			// Beneath the node's own v1 cgroup: the limits its service or container sets
			// (systemd's MemoryMax, TasksMax) hold its modules too.
			dir := filepath.Join(v1[c], ownCgroup(c), name)
			if err := os.Mkdir(dir, 0o755); err == nil || errors.Is(err, os.ErrExist) {
				cg.v1[c] = dir
			}
		}
	}
	return cg, missing
}

// enableV2 turns on the controllers the hierarchy offers for the node's subtree and its
// leaves. A parent with processes of its own (the node's cgroup under systemd) cannot pass
// controllers down, so the node first moves itself into a leaf of its own beside the subtree.
func (cg *cgroups) enableV2(parent string) {
	avail := strings.Fields(readString(filepath.Join(parent, "cgroup.controllers")))
	var want []string
	for _, c := range controllers {
		if slices.Contains(avail, c) {
			want = append(want, "+"+c)
		}
	}
	if len(want) == 0 {
		return
	}
	line := []byte(strings.Join(want, " "))
	err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), line, 0)
	if errors.Is(err, unix.EBUSY) {
		self := filepath.Join(parent, selfLeaf)
		os.Mkdir(self, 0o755)
		if os.WriteFile(filepath.Join(self, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0) == nil {
			err = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), line, 0)
		}
	}
	if err != nil {
		return
	}
	if os.WriteFile(filepath.Join(cg.v2, "cgroup.subtree_control"), line, 0) != nil {
		return
	}
	for _, c := range strings.Fields(readString(filepath.Join(cg.v2, "cgroup.subtree_control"))) {
		cg.v2Ctl[c] = true
	}
}

// selfLeaf is the cgroup, beside its subtree, that a node moves itself into so that its own
// cgroup may pass controllers down.
const selfLeaf = "meshnode-node"

// leaf is one process's cgroups.
type leaf struct {
	v2   string   // "" without v2
	v1   []string // its v1 directories
	join []string // their cgroup.procs, which the launcher writes itself to
}

// makeLeaf makes the cgroups of one process, with its limits. A leaf left by an earlier run
// (the node was killed) is emptied first.
func (cg *cgroups) makeLeaf(name string, lim api.Limits) (*leaf, error) {
	l := &leaf{}
	if cg.v2 != "" {
		l.v2 = filepath.Join(cg.v2, name)
		killTree(l.v2)
		if err := os.Mkdir(l.v2, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("make cgroup %s: %w", l.v2, err)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(cg.v1)) {
		dir := filepath.Join(cg.v1[c], name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("make cgroup %s: %w", dir, err)
		}
		l.v1 = append(l.v1, dir)
		l.join = append(l.join, filepath.Join(dir, "cgroup.procs"))
	}
	if err := l.limit(cg, lim); err != nil {
		l.remove()
		return nil, err
	}
	return l, nil
}

// dirs are the leaf's directories.
func (l *leaf) dirs() []string {
	if l.v2 == "" {
		return l.v1
	}
	return append([]string{l.v2}, l.v1...)
}

// limit writes lim's limits, each through v2 where its controller is enabled, else v1.
func (l *leaf) limit(cg *cgroups, lim api.Limits) error {
	write := func(ctl, v2file, v1file, value string) error {
		var path string
		switch {
		case cg.v2Ctl[ctl]:
			path = filepath.Join(l.v2, v2file)
		case cg.v1[ctl] != "":
			path = filepath.Join(l.v1dir(cg, ctl), v1file)
		default:
			return nil // not limited here; Isolation says so
		}
		if err := os.WriteFile(path, []byte(value), 0); err != nil {
			return fmt.Errorf("limit %s: %w", ctl, err)
		}
		return nil
	}
	if lim.Processes > 0 {
		if err := write("pids", "pids.max", "pids.max", strconv.Itoa(lim.Processes)); err != nil {
			return err
		}
	}
	if lim.Memory > 0 {
		if err := write("memory", "memory.max", "memory.limit_in_bytes", strconv.FormatInt(lim.Memory, 10)); err != nil {
			return err
		}
		if cg.v2Ctl["memory"] {
			os.WriteFile(filepath.Join(l.v2, "memory.swap.max"), []byte("0"), 0) // a limit, not a move to swap
		}
	}
	if lim.CPUWeight > 0 {
		weight, shares := strconv.Itoa(lim.CPUWeight), strconv.Itoa(lim.CPUWeight*1024/100)
		if cg.v2Ctl["cpu"] {
			return write("cpu", "cpu.weight", "", weight)
		}
		return write("cpu", "", "cpu.shares", shares)
	}
	return nil
}

func (l *leaf) v1dir(cg *cgroups, ctl string) string {
	for _, d := range l.v1 {
		if strings.HasPrefix(d, cg.v1[ctl]+"/") {
			return d
		}
	}
	return ""
}

// events counts what the kernel refused the leaf under lim: forks past pids.max, and OOM
// kills past memory.max (a limit not set is not read).
func (l *leaf) events(cg *cgroups, lim api.Limits) (forks, ooms int64) {
	switch d := l.v1dir(cg, "pids"); {
	case lim.Processes == 0:
	case cg.v2Ctl["pids"]:
		forks = eventCount(filepath.Join(l.v2, "pids.events"), "max")
	case d != "":
		forks = eventCount(filepath.Join(d, "pids.events"), "max")
	}
	switch d := l.v1dir(cg, "memory"); {
	case lim.Memory == 0:
	case cg.v2Ctl["memory"]:
		ooms = eventCount(filepath.Join(l.v2, "memory.events"), "oom_kill")
	case d != "":
		ooms = eventCount(filepath.Join(d, "memory.oom_control"), "oom_kill")
	}
	return forks, ooms
}

// kill ends every process in the leaf: through v2, which holds them all, where there is
// one; else through each v1 cgroup.
func (l *leaf) kill() {
	if l.v2 != "" {
		killTree(l.v2)
		return
	}
	for _, d := range l.v1 {
		killProcs(d)
	}
}

// remove kills what is left and removes the leaf's directories.
func (l *leaf) remove() {
	l.kill()
	for _, d := range append([]string{l.v2}, l.v1...) {
		if d != "" {
			rmdirEmptied(d)
		}
	}
}

// killTree ends every process in a v2 cgroup (cgroup.kill, Linux 5.14; else one by one).
func killTree(dir string) {
	if _, err := os.Stat(dir); err != nil {
		return
	}
	if os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0) != nil {
		killProcs(dir)
	}
}

// killProcs SIGKILLs the processes a cgroup lists until it lists none (a fork between a
// read and the kills is caught at the next read), for at most a few seconds.
func killProcs(dir string) {
	for range 100 {
		pids := procs(dir)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procs lists a cgroup's processes.
func procs(dir string) []int {
	var pids []int
	for _, f := range strings.Fields(readString(filepath.Join(dir, "cgroup.procs"))) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// rmdirEmptied removes a cgroup once its killed processes are gone (they leave it when the
// kernel has reaped them, which can take a moment after the kill).
func rmdirEmptied(dir string) {
	for range 1000 {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		if !errors.Is(err, unix.EBUSY) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// eventCount reads "key N" from a cgroup's events file.
func eventCount(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		k, v, ok := bytes.Cut(line, []byte{' '})
		if ok && string(k) == key {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}

func readString(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}
