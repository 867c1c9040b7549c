package api

import (
	"slices"
	"time"
)

// Deployment is what the operator asked for one module (`meshnode deploy`).
type Deployment struct {
	// Version is the artifact's version; Digest its identity when it was deployed.
	Version string `json:"version"`
	Digest  string `json:"digest"`
	// Nodes are the nodes it runs on, sorted; All means every node of the mesh (Nodes empty).
	Nodes []string `json:"nodes,omitempty"`
	All   bool     `json:"all,omitempty"`
	// Instances is how many processes run on each of its nodes.
	Instances int `json:"instances"`
	// Env and Args are given to each process; secrets are never here (the manifest names
	// them, the host fetches them from the vault at apply time).
	Env  map[string]string `json:"env,omitempty"`
	Args []string          `json:"args,omitempty"`
	// Auto deploys each new artifact the build cascade makes of the module, as it is built.
	Auto    bool      `json:"auto,omitempty"`
	Updated time.Time `json:"updated"`
}

// Targets reports whether d runs on node.
func (d *Deployment) Targets(node string) bool {
	return d != nil && (d.All || slices.Contains(d.Nodes, node))
}
