package formats

import (
	"runtime/debug"
)

// version is set at link time by the install script (-ldflags "-X .../formats.version=v1.2.3").
var version = ""

// MeshnodeVersion is meshnode's version: the link-time version, else the module version recorded by
// `go install`, else "dev" with the VCS revision when the build has one.
func MeshnodeVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return "dev-" + rev
}
