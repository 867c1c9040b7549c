// Package config holds a node's configuration: one Config, filled from defaults, then a YAML
// file (meshnode.yaml), then MESHNODE_* environment variables, then flags, each layer
// overriding the one before. Decoding is strict: an unknown key is an error that names it.
// Loading configuration has no side effects; Validate reports the first bad value by key.
package config
