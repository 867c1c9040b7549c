package main

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// pinnedEnv marks a bench that --cpus has executed again on its CPUs: it runs there, and does
// not execute itself again. It is the bench's own, not a node's setting (no MESHNODE_ prefix).
const pinnedEnv = "_MESHNODE_BENCH_PINNED"

// pinCPUs makes the whole bench — the throwaway node, the modules and the raw clients, and
// with --node-process the node's process too — run on n CPUs: the first n of those it may run
// on now. It sets the CPUs of the calling thread and executes the binary again with the same
// arguments, so every thread of the new process inherits them and Go sizes GOMAXPROCS from
// them. In the process it started, it checks that the CPUs are n and returns.
func pinCPUs(n int) error {
	var may unix.CPUSet
	if err := unix.SchedGetaffinity(0, &may); err != nil {
		return fmt.Errorf("--cpus: read the CPUs this process may run on: %w", err)
	}
	if os.Getenv(pinnedEnv) != "" {
		if may.Count() != n {
			return fmt.Errorf("--cpus %d: executed again on %d CPUs", n, may.Count())
		}
		return nil
	}
	if n > may.Count() {
		return usagef("--cpus %d: this process may run on %d CPUs (taskset and cgroups decide which)", n, may.Count())
	}
	var set unix.CPUSet
	for cpu, k := 0, 0; k < n && cpu < len(set)*64; cpu++ {
		if may.IsSet(cpu) {
			set.Set(cpu)
			k++
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--cpus: find this binary to run it again: %w", err)
	}
	// The calling thread's CPUs are what exec passes on: it must stay this goroutine's.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("--cpus: %w", err)
	}
	err = syscall.Exec(exe, os.Args, append(os.Environ(), pinnedEnv+"=1"))
	return fmt.Errorf("--cpus: run %s again on %d CPUs: %w", exe, n, err)
}
