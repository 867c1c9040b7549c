package host

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/meshnode/meshnode/deploy"
)

// sweep ends what an earlier run of the node left behind, before Resume starts anything:
//   - processes of its modules that still run (the node was killed, and nothing stopped
//     them). The sandbox ended those in its cgroups, and those of its module users, when it
//     opened; what is left are processes a version of the node before the sandbox started:
//     found by the MESH_CREDS a process was started with and its working directory, the
//     module's, their groups are killed, so a module never runs twice with the same
//     credentials;
//   - the directories of modules d no longer declares (the node stopped during their
//     undeploy): their seeds and secrets are removed.
func (s *Supervisor) sweep(d deploy.Declaration) {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return // no modules ran here
	}
	creds := map[string]string{} // MESH_CREDS=… → module
	for _, e := range entries {
		if e.IsDir() {
			creds["MESH_CREDS="+filepath.Join(s.Dir, e.Name(), "creds.nk")] = e.Name()
		}
	}
	for pid, module := range processesWith(creds) {
		// A module's process runs in its directory: a shell that merely has the variable
		// (an operator running the module by hand) is left alone, as is the node's group.
		dir := filepath.Join(s.Dir, module)
		if cwd, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "cwd")); err != nil || (cwd != dir && cwd != filepath.Join(dir, workDirName)) {
			continue
		}
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid > 1 && pgid != syscall.Getpgrp() {
			syscall.Kill(-pgid, syscall.SIGKILL)
			s.log().Warn("killed a process an earlier run of the node left running", "module", module, "pid", pid, "pgid", pgid)
		}
	}
	for _, e := range entries {
		if _, declared := d.Module(e.Name()); e.IsDir() && !declared {
			if err := os.RemoveAll(filepath.Join(s.Dir, e.Name())); err != nil {
				s.log().Error("remove an undeclared module's directory", "module", e.Name(), "err", err)
				continue
			}
			if s.Users != nil {
				s.Users.Release(e.Name())
			}
			s.log().Info("removed the directory of a module no longer declared", "module", e.Name())
		}
	}
}

// processesWith returns the processes whose environment holds one of the variables of
// vars (NAME=value → what it stands for), with what it stands for.
func processesWith(vars map[string]string) map[int]string {
	found := map[int]string{}
	if len(vars) == 0 {
		return found
	}
	procs, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", p.Name(), "environ"))
		if err != nil {
			continue // gone, or another user's
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if what, ok := vars[string(kv)]; ok {
				found[pid] = what
				break
			}
		}
	}
	return found
}
