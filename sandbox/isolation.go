package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/meshnode/meshnode/api"
)

// Isolation reads the process's isolation back; false when it is not running.
func (p *Process) Isolation() (api.Isolation, bool) {
	pid := strconv.Itoa(p.Pid)
	st, ok := procStatus(pid)
	if !ok {
		return api.Isolation{}, false
	}
	iso := api.Isolation{Landlock: p.Landlock, NoNewPrivs: st.noNewPrivs, CapEff: st.capEff, Subreaper: p.s.reaper != nil, Limits: p.lim, Reduced: p.s.missing}
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
