package config

import (
	"errors"
	"fmt"

	"regexp"
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

// MaxDuration is the longest duration ParseDuration accepts: 36500d (100 years), the bound a
// seat's retain has too. Longer is no retention period but a typo, and past about 106751d a
// time.Duration overflows (213504d once became 25 minutes).
const MaxDuration = maxDays * 24 * time.Hour

const maxDays = 36500

// ParseDuration parses Go durations plus a leading whole-day part: "7d", "2d12h", "90s". It
// refuses negative values and values over MaxDuration, naming the maximum.
func ParseDuration(s string) (time.Duration, error) {
	orig := s
	s = strings.TrimSpace(s)
	bad := fmt.Errorf("%q is not a duration: write e.g. 7d, 12h or 30s", orig)
	tooLong := fmt.Errorf("%q is longer than the maximum, %dd (%s)", orig, maxDays, time.Duration(MaxDuration))
	if strings.ContainsAny(s, "+-") {
		return 0, fmt.Errorf("%q: a duration here is not signed (and never negative): write e.g. 7d, 12h or 30s", orig)
	}
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseUint(s[:i], 10, 64)
		if errors.Is(err, strconv.ErrRange) {
			return 0, tooLong
		}
		if err != nil {
			return 0, bad
		}
		if n > maxDays {
			return 0, tooLong
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		// time.ParseDuration reports an overflow as invalid: tell that case apart.
		if durationSyntax.MatchString(s) {
			return 0, tooLong
		}
		return 0, bad
	}
	if d > MaxDuration-days {
		return 0, tooLong
	}
	return days + d, nil
}

// durationSyntax is what time.ParseDuration reads (unsigned): a string of it that does not
// parse overflowed.
var durationSyntax = regexp.MustCompile(`^([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))*$`)

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

// Set parses s as ParseDuration does. With String and Type it makes *Duration a flag value
// (pflag.Value), so every duration flag of the CLI reads what the configuration file reads,
// the day suffix included (`token create --ttl 7d`).
func (d *Duration) Set(s string) error {
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Type names a duration flag's value in --help.
func (d *Duration) Type() string { return "duration" }
