package config_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
)

func TestConfig_LoadFile(t *testing.T) {
	t.Run("Overrides", func(t *testing.T) {
		c := config.Up()
		err := c.LoadFile("meshnode.yaml", []byte("name: beta\nclient-addr: 127.0.0.1:5000\nevents-max-age: 2d12h\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := c.Name, "beta"; got != want {
			t.Fatalf("Name=%q, want %q", got, want)
		}
		if got, want := time.Duration(c.EventsMaxAge), 60*time.Hour; got != want {
			t.Fatalf("EventsMaxAge=%v, want %v", got, want)
		}
		if got, want := c.HTTPAddr, config.Up().HTTPAddr; got != want {
			t.Fatalf("HTTPAddr=%q, want default %q", got, want)
		}
	})
	t.Run("UnknownKey", func(t *testing.T) {
		c := config.Up()
		err := c.LoadFile("meshnode.yaml", []byte("name: beta\nclient-adr: 127.0.0.1:5000\n"))
		if !errors.Is(err, config.ErrInvalid) {
			t.Fatalf("err=%v, want ErrInvalid", err)
		}
		if got, want := err.Error(), "line 2: unknown key client-adr; write client-addr"; !strings.Contains(got, want) {
			t.Fatalf("err=%q, want it to say %q", got, want)
		}
		if strings.Contains(err.Error(), "config.Config") {
			t.Fatalf("err=%q names a Go type", err)
		}
		// A key far from every known one: the list of keys.
		err = c.LoadFile("meshnode.yaml", []byte("colour: blue\n"))
		if got, want := fmt.Sprint(err), "line 1: unknown key colour; write one of advertise, audit-max-lag, audit-retention,"; !strings.Contains(got, want) {
			t.Fatalf("err=%q, want it to say %q", got, want)
		}
	})
	t.Run("WrongForm", func(t *testing.T) {
		for text, want := range map[string]string{
			"name: [a]\n":                        "line 1: name takes a single value, not a list",
			"log-level: info\nrate-limit: abc\n": "line 2: rate-limit takes a whole number, not text",
			"builder: maybe\n":                   "line 1: builder takes true or false, not text",
			"git-repos: x\n":                     "line 1: git-repos takes a mapping, e.g. {name: /path}, not text",
			"mesh-seats: {a: b}\n":               "line 1: mesh-seats takes a list, e.g. [a, b], not a mapping",
			"hello\n":                            "line 1: a configuration file is key: value lines",
		} {
			c := config.Up()
			err := c.LoadFile("meshnode.yaml", []byte(text))
			if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "config.Config") {
				t.Errorf("%q: err=%v, want ErrInvalid saying %q and no Go type", text, err, want)
			}
		}
	})
	t.Run("BadDuration", func(t *testing.T) {
		c := config.Up()
		err := c.LoadFile("meshnode.yaml", []byte("shutdown-timeout: soon\n"))
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), `"soon"`) {
			t.Fatalf("err=%v, want ErrInvalid naming the value", err)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		c := config.Up()
		if err := c.LoadFile("meshnode.yaml", nil); err != nil {
			t.Fatalf("empty file: %v", err)
		}
		if !reflect.DeepEqual(c, config.Up()) {
			t.Fatal("empty file changed the configuration")
		}
	})
}

func TestConfig_LoadEnv(t *testing.T) {
	t.Run("Overrides", func(t *testing.T) {
		c := config.Up()
		// MESHNODE_CONFIG and the client verbs' variables are read elsewhere, and pass.
		if err := c.LoadEnv([]string{"PATH=/bin", "MESHNODE_NAME=gamma", "MESHNODE_SHUTDOWN_TIMEOUT=9s", "MESHNODE_CONFIG=x.yaml",
			"MESHNODE_SERVER=nats://h:4222", "MESHNODE_CREDS=op.nk", "MESHNODE_CA=ca.pem", "MESHNODE_CONTEXT=prod"}); err != nil {
			t.Fatal(err)
		}
		if c.Name != "gamma" || time.Duration(c.ShutdownTimeout) != 9*time.Second {
			t.Fatalf("got name %q timeout %v", c.Name, c.ShutdownTimeout)
		}
	})
	t.Run("UnknownVariable", func(t *testing.T) {
		c := config.Up()
		err := c.LoadEnv([]string{"MESHNODE_NAEM=gamma"})
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "MESHNODE_NAEM names no configuration key; write MESHNODE_NAME") {
			t.Fatalf("err=%v, want ErrInvalid naming the variable and the one it is a typo of", err)
		}
		err = c.LoadEnv([]string{"MESHNODE_COLOUR=blue"})
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "meshnode reads MESHNODE_") {
			t.Fatalf("err=%v, want ErrInvalid listing the variables", err)
		}
		// The list names every variable meshnode reads, the client verbs' and join's too.
		for _, v := range []string{"MESHNODE_SERVER", "MESHNODE_CREDS", "MESHNODE_CA", "MESHNODE_CONTEXT", "MESHNODE_CONFIG", "MESHNODE_TOKEN", "MESHNODE_NAME"} {
			if !strings.Contains(err.Error(), v+",") && !strings.HasSuffix(strings.TrimSuffix(err.Error(), ")"), v) {
				t.Errorf("err=%v, want it to list %s", err, v)
			}
		}
		err = c.LoadEnv([]string{"MESHNODE_SERVR=nats://x"})
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "write MESHNODE_SERVER") {
			t.Fatalf("err=%v, want ErrInvalid naming MESHNODE_SERVER", err)
		}
	})
	t.Run("BadDuration", func(t *testing.T) {
		c := config.Up()
		err := c.LoadEnv([]string{"MESHNODE_EVENTS_MAX_AGE=forever"})
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "MESHNODE_EVENTS_MAX_AGE") {
			t.Fatalf("err=%v, want ErrInvalid naming the variable", err)
		}
	})
}

func TestConfig_Validate(t *testing.T) {
	if err := config.Up().Validate(); err != nil {
		t.Fatalf("Up defaults: %v", err)
	}
	if err := config.Run().Validate(); err != nil {
		t.Fatalf("Run defaults: %v", err)
	}
	for _, interval := range []string{"0s", "1m", "24h"} {
		c := config.Up()
		if err := c.Set("snapshot-interval", interval); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("snapshot-interval %s: %v", interval, err)
		}
	}
	for _, sync := range []string{"always", "1s", "30s", "1h"} {
		c := config.Up()
		c.Sync = sync
		if err := c.Validate(); err != nil {
			t.Errorf("sync %s: %v", sync, err)
		}
	}
	for _, tc := range []struct {
		key, value string
	}{
		{"name", "Alpha"},
		{"name", "-a"},
		{"name", ""},
		{"name", strings.Repeat("a", 64)},
		{"gossip-addr", strings.Repeat("a", 254) + ":1"},
		{"client-addr", "localhost"},
		{"client-addr", "127.0.0.1:99999"},
		{"http-addr", "127.0.0.1:http"},
		{"gossip-addr", "bad host:1"},
		{"log-level", "verbose"},
		{"log-format", "xml"},
		{"sync", "never"},
		{"sync", "10ms"},
		{"sync", "2h"},
		{"data-dir", ""},
		{"snapshot-interval", "30s"},
		{"snapshot-keep", "0"},
		{"snapshot-dir", "backups"},
	} {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			c := config.Up()
			if err := c.Set(tc.key, tc.value); err != nil {
				t.Fatal(err)
			}
			err := c.Validate()
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("Validate()=%v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("err=%q does not name %s", err, tc.key)
			}
		})
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "90s": 90 * time.Second, "2m": 2 * time.Minute,
	} {
		got, err := config.ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q)=%v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "xd", "7days", "soon", "-1d"} {
		if _, err := config.ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) succeeded, want an error", in)
		}
	}
}

// TestConfig_ValidateLongest: a name of 63 characters and a host name of 253, the longest
// allowed, pass.
func TestConfig_ValidateLongest(t *testing.T) {
	c := config.Up()
	for key, value := range map[string]string{"name": strings.Repeat("a", 63), "gossip-addr": strings.Repeat("a", 253) + ":1"} {
		if err := c.Set(key, value); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate()=%v, want nil", err)
	}
}

func TestDefaultName(t *testing.T) {
	if n := config.DefaultName(); !config.ValidName(n) {
		t.Fatalf("DefaultName()=%q is not a valid name", n)
	}
}

// TestParseDuration_Bounded: day-suffixed durations are bounded; before, 213504d overflowed
// silently into 25 minutes.
func TestParseDuration_Bounded(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "2d12h": 60 * time.Hour, "90s": 90 * time.Second, "0s": 0,
		"36500d": config.MaxDuration, "36499d24h": config.MaxDuration,
	} {
		if got, err := config.ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q)=%v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"213504d", "36501d", "36500d1s", "99999999999999999999d", "2562048h", "9999999999999999999s", "876001h"} {
		got, err := config.ParseDuration(in)
		if err == nil || !strings.Contains(err.Error(), "36500d") {
			t.Errorf("ParseDuration(%q)=%v, %v; want an error naming the maximum 36500d", in, got, err)
		}
	}
	for _, in := range []string{"-1h", "7d-1h", "+5s", "soon", "d", "7x"} {
		if got, err := config.ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q)=%v, want an error", in, got)
		}
	}
	t.Run("InConfig", func(t *testing.T) {
		c := config.Up()
		err := c.LoadFile("meshnode.yaml", []byte("events-max-age: 213504d\n"))
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "maximum") || !strings.Contains(err.Error(), "line 1") {
			t.Fatalf("err=%v, want ErrInvalid naming the maximum and the line", err)
		}
		if err := c.LoadEnv([]string{"MESHNODE_AUDIT_RETENTION=213504d"}); !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "maximum") {
			t.Fatalf("env: err=%v, want ErrInvalid naming the maximum", err)
		}
	})
}

// TestConfig_MeshSeats: every node is a candidate for the mesh's own seats by default; the
// file takes a list, the environment and flags a comma-separated one ("" for none); a seat
// a node does not hold itself is refused.
func TestConfig_MeshSeats(t *testing.T) {
	c := config.Up()
	if !c.Holds("mesh-controller") || !c.Holds("mesh-vault") {
		t.Fatalf("default mesh-seats %v, want both of the nodes' seats", c.MeshSeats)
	}
	if err := c.LoadFile("meshnode.yaml", []byte("mesh-seats: [mesh-vault]\n")); err != nil {
		t.Fatal(err)
	}
	if c.Holds("mesh-controller") || !c.Holds("mesh-vault") {
		t.Fatalf("from the file: %v", c.MeshSeats)
	}
	if err := c.LoadEnv([]string{"MESHNODE_MESH_SEATS=mesh-controller, mesh-vault"}); err != nil {
		t.Fatal(err)
	}
	if !c.Holds("mesh-controller") || !c.Holds("mesh-vault") {
		t.Fatalf("from the environment: %v", c.MeshSeats)
	}
	if err := c.Set("mesh-seats", ""); err != nil || len(c.MeshSeats) != 0 {
		t.Fatalf("mesh-seats \"\": %v, %v", c.MeshSeats, err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("a node holding none of the mesh's seats: %v", err)
	}
	c.Set("mesh-seats", "mesh-controller,mesh-git")
	if err := c.Validate(); !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), `"mesh-git" is not a seat a node holds itself`) {
		t.Fatalf("mesh-git in mesh-seats: %v", err)
	}
}

func TestConfig_BuildPaths(t *testing.T) {
	c := config.Up()
	if err := c.Set("build-paths", "/opt/jdk, /srv/sdk"); err != nil || len(c.BuildPaths) != 2 || c.BuildPaths[1] != "/srv/sdk" {
		t.Fatalf("build-paths: %v %v", c.BuildPaths, err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"opt/jdk", "/"} {
		c.Set("build-paths", bad)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "absolute directory") {
			t.Errorf("build-paths %q: %v, want refused", bad, err)
		}
	}
}
