package api

// Isolation is what a running process got, read back from the kernel (/proc/<pid>/status
// and /proc/<pid>/cgroup) and from its launcher's report, not from configuration.
type Isolation struct {
	User       string `json:"user"`                // "uid 61234", or "the node's (uid 1000)"
	Landlock   string `json:"landlock"`            // "abi 7", or "none"
	NoNewPrivs bool   `json:"no_new_privs"`        // NoNewPrivs in its status
	CapEff     string `json:"cap_eff"`             // its effective capabilities, hex
	Cgroup     string `json:"cgroup,omitempty"`    // its cgroup v2 ("" none)
	Subreaper  bool   `json:"subreaper,omitempty"` // no cgroup: the node reaps its orphans
	Limits     Limits `json:"limits"`              // what was asked of the kernel
	// Unenforced names the limits asked for that this machine has no controller for
	// ("memory", "processes", "cpu"): the kernel does not hold them.
	Unenforced []string `json:"unenforced,omitempty"`
	Reduced    []string `json:"reduced,omitempty"` // what full isolation lacks here
}

// Limits bound one process's use of the machine; zero means no limit.
type Limits struct {
	Memory    int64 `json:"memory,omitempty"`     // bytes (memory.max)
	Processes int   `json:"processes,omitempty"`  // tasks (pids.max)
	CPUWeight int   `json:"cpu_weight,omitempty"` // 1–10000, 100 the default (cpu.weight)
	Disk      int64 `json:"disk,omitempty"`       // bytes under DiskDir, checked while it runs
}
