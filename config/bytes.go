package config

import "github.com/meshnode/meshnode/manifest"

// Bytes is a size in bytes that also accepts a unit: "512MiB", "10GB", "1GiB", "4096". Zero
// means "size it automatically" wherever a Bytes option says so. It is manifest.Size: a
// manifest's limits are written the same way.
type Bytes = manifest.Size

// ParseBytes reads a size with an optional unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB).
func ParseBytes(s string) (Bytes, error) { return manifest.ParseSize(s) }
