package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

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

// Isolation reads the process's isolation back; false when it is not running.
func (p *Process) Isolation() (Isolation, bool) {
	pid := strconv.Itoa(p.Pid)
	st, ok := procStatus(pid)
	if !ok {
		return Isolation{}, false
	}
	iso := Isolation{Landlock: p.Landlock, NoNewPrivs: st.noNewPrivs, CapEff: st.capEff, Subreaper: p.s.reaper != nil, Limits: p.lim, Reduced: p.s.missing}
	for _, c := range []struct {
		name, ctl string
		asked     bool
	}{{"memory", "memory", p.lim.Memory > 0}, {"processes", "pids", p.lim.Processes > 0}, {"cpu", "cpu", p.lim.CPUWeight > 0}} {
		if c.asked && !p.s.cg.v2Ctl[c.ctl] && p.leaf.v1dir(p.s.cg, c.ctl) == "" {
			iso.Unenforced = append(iso.Unenforced, c.name)
		}
	}
	if st.uid == os.Geteuid() {
		iso.User = fmt.Sprintf("the node's (uid %d)", st.uid)
	} else {
		iso.User = fmt.Sprintf("uid %d", st.uid)
	}
	b, _ := os.ReadFile("/proc/" + pid + "/cgroup")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok && rest != "/" {
			iso.Cgroup = rest
		}
	}
	return iso, true
}
