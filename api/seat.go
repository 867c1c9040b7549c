package api

import "github.com/meshnode/meshnode/manifest"

// SeatInfo names a seat and, when a registered module declares it, its scope and protocol: of
// one version (Version; "" is v1), and for the seats a module declares, its later versions.
// The registry answers it (whoami's uses and seats, `meshnode seat ls`); package seats calls
// it Info.
type SeatInfo struct {
	Seat    string         `json:"seat"`
	Version string         `json:"version,omitempty"`
	Scope   manifest.Scope `json:"scope,omitempty"` // "" when no registered module declares it
	Accepts []string       `json:"accepts,omitempty"`
	Serves  []string       `json:"serves,omitempty"`
	Emits   []string       `json:"emits,omitempty"`
	// Shapes are the declared JSON shapes of its verbs', tools' and events' payloads.
	Shapes map[string]*manifest.Shape `json:"shapes,omitempty"`
	// Versions are the seat's later protocol versions (a declared seat's, to its holder).
	Versions []SeatInfo `json:"versions,omitempty"`
}

// SeatInfoOf describes version of s ("" or v1: the first) as SeatInfo, without later versions.
func SeatInfoOf(s manifest.Seat, version string) SeatInfo {
	at, ok := s.At(version)
	if !ok {
		return SeatInfo{Seat: s.Name, Version: version}
	}
	if version == manifest.V1 {
		version = ""
	}
	return SeatInfo{Seat: s.Name, Version: version, Scope: at.Scope, Accepts: at.Accepts, Serves: at.Serves, Emits: at.Emits, Shapes: at.Shapes}
}

// At returns the version of the seat i describes, from i and its Versions ("" is v1).
func (i SeatInfo) At(version string) (SeatInfo, bool) {
	if version == "" || version == manifest.V1 {
		i.Versions = nil
		return i, true
	}
	for _, v := range i.Versions {
		if v.Version == version {
			return v, true
		}
	}
	return SeatInfo{}, false
}
