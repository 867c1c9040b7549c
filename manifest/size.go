package manifest

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Size is a size in bytes that also accepts a unit: "512MiB", "10GB", "1GiB", "4096". Zero
// means no limit in a manifest's limits, and "size it automatically" wherever a node option
// says so.
type Size int64

// sizeUnits are the suffixes ParseSize reads, longest first so "MiB" is not read as "B".
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// ParseSize parses a whole number of bytes with an optional unit (KiB, MiB, GiB, TiB, KB,
// MB, GB, TB). It refuses negative, fractional and overflowing values.
func ParseSize(s string) (Size, error) {
	orig := s
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size: write a whole number of bytes with a unit, e.g. 512MiB or 10GB", orig)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is larger than the largest size, %d bytes", orig, int64(math.MaxInt64))
	}
	return Size(n * mult), nil
}

// String prints b with the largest binary unit that divides it.
func (b Size) String() string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.mult == 0 {
			return strconv.FormatInt(int64(b)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// UnmarshalYAML decodes a size written as text or a number.
func (b *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New("a size is written as text, e.g. 512MiB")
	}
	v, err := ParseSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*b = v
	return nil
}

// MarshalYAML encodes b as text.
func (b Size) MarshalYAML() (any, error) { return b.String(), nil }
