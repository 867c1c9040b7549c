package config

import (
	"errors"
	"fmt"

	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

func sortStrings(s []string) { slices.Sort(s) }

// Duration is a time.Duration that also accepts a day suffix ("7d", "1d12h"), as retention
// periods are naturally written in days.
type Duration time.Duration

// ParseDuration parses Go durations plus a leading whole-day part: "7d", "2d12h", "90s".
func ParseDuration(s string) (time.Duration, error) {
	orig := s
	s = strings.TrimSpace(s)
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a duration: write e.g. 7d, 12h or 30s", orig)
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration: write e.g. 7d, 12h or 30s", orig)
	}
	return days + d, nil
}

// String formats d, using days when it is a whole number of them.
func (d Duration) String() string {
	td := time.Duration(d)
	if td > 0 && td%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(td/(24*time.Hour)), 10) + "d"
	}
	return td.String()
}

// UnmarshalYAML decodes a duration written as text.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New("a duration is written as text, e.g. 7d or 30s")
	}
	v, err := ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML encodes d as text.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }
