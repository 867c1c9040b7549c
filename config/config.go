package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshnode/meshnode/internal/suggest"
	"github.com/meshnode/meshnode/manifest"
	"go.yaml.in/yaml/v3"
)

// Defaults. `meshnode up` is the homelab path: everything on loopback and the data dir in the
// current directory. `meshnode run` is the service path.
const (
	DefaultUpDataDir  = "./meshnode-data"
	DefaultRunDataDir = "/var/lib/meshnode"

	DefaultClientPort  = 4222
	DefaultClusterPort = 6222
	DefaultGossipPort  = 7946
	DefaultHTTPPort    = 8422

	DefaultLogLevel  = "info"
	DefaultLogFormat = "text"
	// DefaultSync is nats-server's own background flush: always costs 5× a one-at-a-time
	// publisher's rate and 14× a pipelined one's (BenchmarkSyncPolicy).
	DefaultSync            = "2m"
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultProvisionInterval is ProvisionInterval's default.
	DefaultProvisionInterval = time.Minute
	// DefaultDriftInterval is DriftInterval's default.
	DefaultDriftInterval = 10 * time.Second
	// DefaultFloodRate is FloodRate's default: a hundred times what a module asks of the
	// node's tools at rate-limit, far above any one connection's steady work, far below what
	// one client sends when it sends as fast as it can (hundreds of thousands a second).
	DefaultFloodRate = 20000
	// DefaultFloodBar and DefaultFloodBarMax are FloodBar's and FloodBarMax's defaults.
	DefaultFloodBar     = 10 * time.Second
	DefaultFloodBarMax  = 10 * time.Minute
	DefaultEventsMaxAge = 7 * 24 * time.Hour
	// DefaultSnapshotKeep is SnapshotKeep's default: a week of daily snapshots.
	DefaultSnapshotKeep = 7
	// MinSnapshotInterval is the shortest SnapshotInterval: a snapshot reads every stream
	// of the mesh, so one more often than this would keep the disk busy with copies.
	MinSnapshotInterval = time.Minute

	// FileName is the configuration file looked for in the data dir when --config is not given.
	FileName = "meshnode.yaml"
	// EnvPrefix starts every environment variable that configures a node.
	EnvPrefix = "MESHNODE_"
)

// MinStoreBytes is the smallest store-max-bytes a node accepts.
const MinStoreBytes = 32 << 20

// MinDeadBytesPerConsumer is the smallest dead-max-bytes-per-consumer a node accepts.
const MinDeadBytesPerConsumer = 4 << 10

// ErrInvalid is wrapped by every error that Validate and the loaders return for a bad value;
// the CLI maps it to exit code 2.
var ErrInvalid = errors.New("invalid configuration")

// Config is a node's configuration. Every field has a yaml key, an environment variable
// (MESHNODE_ + the key upper-cased with '-' as '_') and a flag of the same name.
type Config struct {
	// DataDir holds the node's bbolt file, its nkey seed, JetStream's store and node.json.
	DataDir string `yaml:"data-dir"`
	// Name is the node's name: stable, it is the NATS server name and the raft identity.
	Name string `yaml:"name"`
	// ClientAddr is host:port for NATS clients (modules, the CLI). Port 0 picks a free port.
	ClientAddr string `yaml:"client-addr"`
	// ClusterAddr is host:port for NATS routes between nodes.
	ClusterAddr string `yaml:"cluster-addr"`
	// GossipAddr is host:port for membership gossip.
	GossipAddr string `yaml:"gossip-addr"`
	// Advertise is the host (an IP address or DNS name) the other servers reach this node
	// at, when its addresses bind every interface: its routes, client and gossip addresses
	// are advertised with it. Empty: the bound addresses' hosts.
	Advertise string `yaml:"advertise"`
	// LeafAddr is host:port where this server accepts sites' leafnode links (issue 42;
	// `meshnode join --leaf`); empty: it accepts none. Beyond loopback it is TLS, with the
	// node's certificate from the mesh's CA.
	LeafAddr string `yaml:"leaf-addr"`
	// HTTPAddr is host:port for /healthz, /readyz, /metrics, the status API and the console.
	// Port 0 picks a free port. Beyond loopback it is HTTPS, with the node's certificate
	// from the mesh's CA.
	HTTPAddr string `yaml:"http-addr"`
	// LogLevel is one of debug, info, warn, error.
	LogLevel string `yaml:"log-level"`
	// LogFormat is text or json.
	LogFormat string `yaml:"log-format"`
	// ShutdownTimeout bounds a graceful stop.
	ShutdownTimeout Duration `yaml:"shutdown-timeout"`
	// EventsMaxAge is how long the EVENTS stream keeps an event. Under 2 minutes it is also
	// EVENTS' duplicate window, shorter than the minute the sdk sends an unacknowledged event
	// again in: a resend may then be stored twice (the audit log records it once).
	EventsMaxAge Duration `yaml:"events-max-age"`
	// AuditRetention is how long the node's audit log keeps a record; zero keeps everything.
	AuditRetention Duration `yaml:"audit-retention"`
	// Sync is when JetStream writes what it stored to the disk: "always" (before each ack)
	// or a duration (in the background, that often). An ack always means the write reached
	// the OS (a process crash loses nothing); only an OS crash or power loss of a majority
	// of a stream's servers within the interval can lose acked writes (docs/operations.md).
	Sync string `yaml:"sync"`
	// StoreMaxBytes is the most JetStream may store on this node; zero lets nats-server size
	// it from the disk (75% of what is free). The mesh's streams are sized within it, and
	// part of it is kept for the control plane (leases, registry, vault), so a full store
	// never costs a seat.
	StoreMaxBytes Bytes `yaml:"store-max-bytes"`
	// EventsMaxBytes is the most EVENTS keeps; past it new emits are refused (nothing accepted
	// is evicted). Zero: half of the store.
	EventsMaxBytes Bytes `yaml:"events-max-bytes"`
	// ModuleEventsMaxBytes is the most of EVENTS one module may hold (its own events and its
	// seats'); past it the module's emits are refused until its oldest events age out.
	// Zero: a quarter of EVENTS.
	ModuleEventsMaxBytes Bytes `yaml:"module-events-max-bytes"`
	// ClientTLS says when the client port is TLS, with the node's certificate from the mesh's
	// CA: "auto" when client-addr is not a loopback address, "always" even then.
	ClientTLS string `yaml:"client-tls"`
	// DeadMaxBytes is the most DEAD keeps. Zero: a tenth of the store.
	DeadMaxBytes Bytes `yaml:"dead-max-bytes"`
	// DeadMaxBytesPerConsumer is the most of DEAD one consumer's dead letters may hold: past
	// it the node removes that consumer's own oldest letters to write its next, and a letter
	// larger than it is not kept. A registration that would give DEAD more consumers than it
	// holds shares for is refused. Zero: a 16384th of DEAD, at least 64KiB.
	DeadMaxBytesPerConsumer Bytes `yaml:"dead-max-bytes-per-consumer"`
	// SeatMaxBytes is the most the work queue of a seat keeps when its manifest declares no
	// backlog:, and what the node reserves for it. Zero: a 1024th of what the control plane,
	// EVENTS, DEAD and the provisions leave of the store for seat queues, from 1 MiB to
	// 16 MiB, so about a thousand such seats fit on any store from 5 GiB up. Every seat's
	// reservation together must fit in that room, checked at registration.
	SeatMaxBytes Bytes `yaml:"seat-max-bytes"`
	// MaxEventBytes is the largest event payload EVENTS accepts, headers included. Zero: the
	// bus's maximum message size.
	MaxEventBytes Bytes `yaml:"max-event-bytes"`
	// RateLimit is how many requests a second one module (or join token) may make of the
	// node's whoami and seat tools and of the vault, with bursts of twice as many; the rest
	// are refused and counted in one event per interval. Zero: no limit.
	RateLimit int `yaml:"rate-limit"`
	// EmitRate is how many events and seat jobs a second one module may send on this node,
	// with a quarter as many at once; past it the node's admitter refuses them, retryably
	// (DESIGN §14).
	// Zero: no pace (flood-rate still bars a connection past its own rate: raise it, or set
	// it to zero too, for a module that pipelines faster).
	EmitRate int `yaml:"emit-rate"`
	// AuditMaxLag is how many events a live member's audit log may be behind EVENTS before
	// emits are refused, retryably, until it catches up: back-pressure instead of loss.
	// Zero: no back-pressure.
	AuditMaxLag int `yaml:"audit-max-lag"`
	// FloodRate is how many messages a second one module connection may send, with bursts
	// of a quarter second's worth, before the node ends the flood: it disconnects every connection of the
	// module's key and refuses its connects for flood-bar. A module refused by the rate
	// limits more than ten times its rate-limit in two seconds is barred the same way. Zero:
	// connections' rates are not watched (the rate limits' refusals still bar).
	FloodRate int `yaml:"flood-rate"`
	// FloodBar is how long a module barred for flooding is refused first; each bar that
	// follows its return flooding lasts twice the one before, up to flood-bar-max, and a
	// module quiet for twice its last bar starts at flood-bar again.
	FloodBar Duration `yaml:"flood-bar"`
	// FloodBarMax is the longest bar of a module that keeps on flooding.
	FloodBarMax Duration `yaml:"flood-bar-max"`
	// MeshSeats are the mesh's own seats this node is a candidate for: mesh-controller (it
	// answers registration), mesh-vault (only on a node holding the vault's credentials).
	// Every node is by default; a node left out of both still runs modules and serves the
	// bus. In the environment and on the command line: comma-separated, "" for none.
	MeshSeats []string `yaml:"mesh-seats"`
	// GitRepos are the local bare git repositories this node serves to the build cascade,
	// by the name manifests use in build.from; a node with any is a candidate for the
	// mesh-git seat. In the environment and on the command line: name=path, comma-separated.
	GitRepos map[string]string `yaml:"git-repos"`
	// Builder makes the node a candidate for the mesh-build-machine seat: it runs build jobs.
	Builder bool `yaml:"builder"`
	// NameGiven says the name came from the file, the environment or a flag, not the host
	// name: a node whose data dir holds another name refuses to start, where one started
	// without a name takes the data dir's (a unit without --name on a renamed host).
	NameGiven bool `yaml:"-"`
	// ProvisionInterval is how often the controller's holder asks every provider what it
	// holds (DESIGN §12): a lost resource is created again, an orphan removed, within it.
	ProvisionInterval Duration `yaml:"provision-interval"`
	// DriftInterval is how often the node checks the mesh's streams, buckets and consumers
	// against what they should be, and repairs what it may (a deletion's advisory starts a
	// check at once); bad records in the registry and the vault are reported by it too.
	DriftInterval Duration `yaml:"drift-interval"`
	// SnapshotInterval is how often the server holding the mesh-controller seat writes a
	// snapshot of the mesh (what `meshnode snapshot save` writes) into snapshot-dir, as
	// snapshot-<UTC time>.tar; zero: never. At least 1m.
	SnapshotInterval Duration `yaml:"snapshot-interval"`
	// SnapshotDir is where scheduled snapshots are written, an absolute path; "":
	// <data-dir>/snapshots. Put it on another disk than the data dir, and copy its files off
	// the machine: a snapshot beside the data it backs up is lost with it.
	SnapshotDir string `yaml:"snapshot-dir"`
	// SnapshotKeep is how many scheduled snapshots snapshot-dir keeps: the oldest beyond it
	// are deleted after each new one (only files named snapshot-<UTC time>.tar).
	SnapshotKeep int `yaml:"snapshot-keep"`
	// Isolation is how isolated modules and builds must run (DESIGN §13): "full" refuses
	// to start one without Landlock's scoping and a cgroup v2 to contain its processes;
	// "reduced" starts it with what the machine gives, and says what is missing.
	Isolation string `yaml:"isolation"`
	// Cgroup is the cgroup v2 beneath which the node makes its modules' cgroups: a path in
	// the v2 hierarchy, or "" for the node's own (delegated by systemd's Delegate=yes; any
	// cgroup when the node is root).
	Cgroup string `yaml:"cgroup"`
	// ModuleUIDs is the range of uids, first-last, a node running as root gives its
	// modules, one each. "": 1,024 uids of the node's own, drawn by its data dir
	// (sandbox.NodeUIDs), so two nodes on one machine never share one.
	ModuleUIDs string `yaml:"module-uids"`
	// ModuleMemory is the most memory one module instance may use (memory.max); zero: no limit.
	ModuleMemory Bytes `yaml:"module-memory"`
	// ModuleProcesses is the most processes one module instance may have (pids.max); zero:
	// no limit.
	ModuleProcesses int `yaml:"module-processes"`
	// ModuleDisk is the most one module instance may keep in its work directory; past it
	// the instance is ended and reported. Zero: no limit.
	ModuleDisk Bytes `yaml:"module-disk"`
	// BuildPaths are the directories, absolute, a build may read (and run from) besides its
	// tree and the system's runtime: toolchains installed outside /usr (a JDK in /opt, an
	// SDK in a home). In the environment and on the command line: comma-separated.
	BuildPaths []string `yaml:"build-paths"`
}

// Isolation's values.
const (
	IsolationFull    = "full"
	IsolationReduced = "reduced"
)

// Module limits' defaults: enough for a runtime with its threads and a working set of files,
// few enough that a fork bomb or a runaway log is ended long before the node suffers.
const (
	DefaultModuleProcesses = 512
	DefaultModuleDisk      = 1 << 30
)

// UIDRange parses ModuleUIDs: 0, 0 when it is "" (the node's own range).
func (c Config) UIDRange() (first, last int, err error) {
	if c.ModuleUIDs == "" {
		return 0, 0, nil
	}
	a, b, ok := strings.Cut(c.ModuleUIDs, "-")
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || first <= 0 || last < first {
		return 0, 0, fmt.Errorf("%w: module-uids %q: a range of unprivileged uids, first-last, e.g. 200000-201023 (or leave it out: the node draws 1,024 of its own)", ErrInvalid, c.ModuleUIDs)
	}
	return first, last, nil
}

// Holds reports whether the node is a candidate for the mesh's own seat.
func (c Config) Holds(seat string) bool { return slices.Contains(c.MeshSeats, seat) }

// DefaultRateLimit is RateLimit's default: far above what a module asks at start (one whoami
// per connection, a fetch per secret), far below what starves the others.
const DefaultRateLimit = 100

// DefaultEmitRate is EmitRate's default: a fifth of what one node's audit log records a second
// on two cores (about 13,000), so no one module can take all of it.
const DefaultEmitRate = 2_000

// DefaultAuditMaxLag is AuditMaxLag's default: about a second of the audit log's work, so an
// event is audited within a second or two of its ack even at the mesh's highest emit rate.
const DefaultAuditMaxLag = 10_000

// Up returns the defaults of `meshnode up`: a single node on loopback.
func Up() Config {
	return Config{
		DataDir:           DefaultUpDataDir,
		Name:              DefaultName(),
		ClientAddr:        net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultClientPort)),
		ClusterAddr:       net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultClusterPort)),
		GossipAddr:        net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultGossipPort)),
		HTTPAddr:          net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultHTTPPort)),
		LogLevel:          DefaultLogLevel,
		LogFormat:         DefaultLogFormat,
		Sync:              DefaultSync,
		ShutdownTimeout:   Duration(DefaultShutdownTimeout),
		ProvisionInterval: Duration(DefaultProvisionInterval),
		DriftInterval:     Duration(DefaultDriftInterval),
		EventsMaxAge:      Duration(DefaultEventsMaxAge),
		SnapshotKeep:      DefaultSnapshotKeep,
		RateLimit:         DefaultRateLimit,
		EmitRate:          DefaultEmitRate,
		AuditMaxLag:       DefaultAuditMaxLag,
		FloodRate:         DefaultFloodRate,
		FloodBar:          Duration(DefaultFloodBar),
		FloodBarMax:       Duration(DefaultFloodBarMax),
		MeshSeats:         slices.Clone(manifest.NodeHeldSeats),
		Isolation:         IsolationFull,
		ModuleProcesses:   DefaultModuleProcesses,
		ModuleDisk:        DefaultModuleDisk,
	}
}

// Run returns the defaults of `meshnode run`: a service listening on every interface, with
// its data in /var/lib/meshnode. The HTTP API stays on loopback: it carries no auth.
func Run() Config {
	c := Up()
	c.DataDir = DefaultRunDataDir
	c.ClientAddr = net.JoinHostPort("0.0.0.0", strconv.Itoa(DefaultClientPort))
	c.ClusterAddr = net.JoinHostPort("0.0.0.0", strconv.Itoa(DefaultClusterPort))
	c.GossipAddr = net.JoinHostPort("0.0.0.0", strconv.Itoa(DefaultGossipPort))
	return c
}

// nameRE is a name's characters; its length is checked apart: a counted repetition
// ({0,62}) compiles to a copy of the class for each count, 21 KB of heap for the node's life.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// ValidName reports whether s is a valid node name: lower-case [a-z0-9][a-z0-9-]*, at most
// 63 characters.
func ValidName(s string) bool { return len(s) <= 63 && nameRE.MatchString(s) }

// DefaultName derives a node name from the host name, or "node" if it yields nothing valid.
func DefaultName() string {
	h, err := os.Hostname()
	if err != nil {
		return "node"
	}
	h, _, _ = strings.Cut(strings.ToLower(h), ".")
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if len(name) > 63 {
		name = name[:63]
	}
	if !ValidName(name) {
		return "node"
	}
	return name
}

// LoadFile decodes the YAML configuration in data over c. Unknown keys are refused with
// the key and its line.
func (c *Config) LoadFile(path string, data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	name := c.Name
	c.Name = "" // to see whether the file names the node
	defer func() {
		if c.Name == "" {
			c.Name = name
		} else {
			c.NameGiven = true
		}
	}()
	if err := dec.Decode(c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file sets nothing
		}
		return fmt.Errorf("%w: %s: %s", ErrInvalid, path, decodeError(err, data))
	}
	return nil
}

// yaml.v3's messages for a key KnownFields refuses and for a value of the wrong form: the
// only way it names the line.
var (
	unknownKeyRE = regexp.MustCompile(`^line (\d+): field (.+) not found in type config\.Config$`)
	wrongFormRE  = regexp.MustCompile("^line (\\d+): cannot unmarshal !!(\\w+)(?: `.*`)? into (.+)$")
)

// forms says what a value of a configuration field's Go type is written as.
var forms = map[string]string{
	"string": "a single value", "int": "a whole number", "bool": "true or false",
	"[]string": "a list, e.g. [a, b]", "map[string]string": "a mapping, e.g. {name: /path}",
}

// decodeError says what is wrong with a configuration file in its terms, not a Go type's:
// an unknown key with the key it is probably a typo of (or the list of keys), a value of the
// wrong form with the form its key takes.
func decodeError(err error, data []byte) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return strings.TrimPrefix(err.Error(), "yaml: ")
	}
	lines := strings.Split(string(data), "\n")
	msgs := make([]string, 0, len(te.Errors))
	for _, msg := range te.Errors {
		if sm := unknownKeyRE.FindStringSubmatch(msg); sm != nil {
			keys := Keys()
			slices.Sort(keys)
			msg = fmt.Sprintf("line %s: unknown key %s; write one of %s", sm[1], sm[2], strings.Join(keys, ", "))
			if near := suggest.Nearest(sm[2], keys); near != "" {
				msg = fmt.Sprintf("line %s: unknown key %s; write %s", sm[1], sm[2], near)
			}
		} else if sm := wrongFormRE.FindStringSubmatch(msg); sm != nil {
			msg = fmt.Sprintf("line %s: a configuration file is key: value lines, e.g. name: alpha", sm[1])
			n, _ := strconv.Atoi(sm[1])
			if form, ok := forms[sm[3]]; ok && n >= 1 && n <= len(lines) {
				key, _, _ := strings.Cut(strings.TrimSpace(lines[n-1]), ":")
				msg = fmt.Sprintf("line %s: %s takes %s, not %s", sm[1], key, form, tagName(sm[2]))
			}
		}
		msgs = append(msgs, msg)
	}
	return strings.Join(msgs, "; ")
}

// tagName names a YAML tag's value as a user writes it.
func tagName(tag string) string {
	switch tag {
	case "seq":
		return "a list"
	case "map":
		return "a mapping"
	case "str":
		return "text"
	case "int", "float":
		return "a number"
	case "bool":
		return "true or false"
	}
	return "!!" + tag
}

// keys maps each configuration key to its field, for the environment and for error messages.
func (c *Config) keys() map[string]any {
	return map[string]any{
		"data-dir":                &c.DataDir,
		"name":                    &c.Name,
		"client-addr":             &c.ClientAddr,
		"cluster-addr":            &c.ClusterAddr,
		"gossip-addr":             &c.GossipAddr,
		"advertise":               &c.Advertise,
		"leaf-addr":               &c.LeafAddr,
		"http-addr":               &c.HTTPAddr,
		"log-level":               &c.LogLevel,
		"log-format":              &c.LogFormat,
		"shutdown-timeout":        &c.ShutdownTimeout,
		"events-max-age":          &c.EventsMaxAge,
		"audit-retention":         &c.AuditRetention,
		"store-max-bytes":         &c.StoreMaxBytes,
		"sync":                    &c.Sync,
		"events-max-bytes":        &c.EventsMaxBytes,
		"module-events-max-bytes": &c.ModuleEventsMaxBytes,
		"client-tls":              &c.ClientTLS,
		"dead-max-bytes":          &c.DeadMaxBytes,
		"seat-max-bytes":          &c.SeatMaxBytes,
		"max-event-bytes":         &c.MaxEventBytes,
		"rate-limit":              &c.RateLimit,
		"emit-rate":               &c.EmitRate,
		"audit-max-lag":           &c.AuditMaxLag,
		"flood-rate":              &c.FloodRate,
		"flood-bar":               &c.FloodBar,
		"flood-bar-max":           &c.FloodBarMax,
		"mesh-seats":              &c.MeshSeats,
		"git-repos":               &c.GitRepos,
		"builder":                 &c.Builder,
		"provision-interval":      &c.ProvisionInterval,
		"drift-interval":          &c.DriftInterval,
		"snapshot-interval":       &c.SnapshotInterval,
		"snapshot-dir":            &c.SnapshotDir,
		"snapshot-keep":           &c.SnapshotKeep,
		"isolation":               &c.Isolation,
		"cgroup":                  &c.Cgroup,
		"module-uids":             &c.ModuleUIDs,
		"module-memory":           &c.ModuleMemory,
		"module-processes":        &c.ModuleProcesses,
		"module-disk":             &c.ModuleDisk,
		"build-paths":             &c.BuildPaths,

		"dead-max-bytes-per-consumer": &c.DeadMaxBytesPerConsumer,
	}
}

// ScheduledSnapshotDir is where scheduled snapshots go: SnapshotDir, or
// <data-dir>/snapshots when it is "".
func (c Config) ScheduledSnapshotDir() string {
	if c.SnapshotDir != "" {
		return c.SnapshotDir
	}
	return filepath.Join(c.DataDir, "snapshots")
}

// Keys lists every configuration key.
func Keys() []string {
	var c Config
	out := make([]string, 0, 10)
	for k := range c.keys() {
		out = append(out, k)
	}
	return out
}

// EnvName returns the environment variable for a configuration key.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, "-", "_"))
}

// envIgnored are MESHNODE_ variables that are not configuration keys but are read elsewhere:
// the configuration file, a join token, and the client verbs' server, seed, CA and context
// (cmd/meshnode), which a shell may export for every verb.
var envIgnored = map[string]bool{
	EnvPrefix + "CONFIG": true, TokenEnv: true,
	EnvPrefix + "SERVER": true, EnvPrefix + "CREDS": true, EnvPrefix + "CA": true, EnvPrefix + "CONTEXT": true,
}

// TokenEnv carries a join or founding token to `meshnode join` without a command line that
// every user of the machine can read.
const TokenEnv = EnvPrefix + "TOKEN"

// LoadEnv applies MESHNODE_* variables from environ (os.Environ's form). A MESHNODE_ variable
// that names no key is refused, so a typo does not silently do nothing.
func (c *Config) LoadEnv(environ []string) error {
	byEnv := make(map[string]string)
	for k := range c.keys() {
		byEnv[EnvName(k)] = k
	}
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || envIgnored[name] {
			continue
		}
		key, ok := byEnv[name]
		if !ok {
			if near := suggest.Nearest(name, envNames()); near != "" {
				return fmt.Errorf("%w: environment variable %s names no configuration key; write %s", ErrInvalid, name, near)
			}
			return fmt.Errorf("%w: environment variable %s names no configuration key (meshnode reads %s)",
				ErrInvalid, name, strings.Join(envNames(), ", "))
		}
		if err := c.Set(key, value); err != nil {
			return fmt.Errorf("%w (from %s)", err, name)
		}
	}
	return nil
}

// envNames is every MESHNODE_ variable meshnode reads, sorted: the configuration keys' and
// envIgnored's (a typo of MESHNODE_SERVER is told its name, and the list a stray variable is
// shown names the client verbs' too).
func envNames() []string {
	var out []string
	for _, k := range Keys() {
		out = append(out, EnvName(k))
	}
	for name := range envIgnored {
		out = append(out, name)
	}
	sortStrings(out)
	return out
}

// Get returns the value of a text-valued configuration key (an address, a name).
func (c *Config) Get(key string) (string, error) {
	p, ok := c.keys()[key]
	if !ok {
		return "", fmt.Errorf("%w: unknown key %q", ErrInvalid, key)
	}
	s, ok := p.(*string)
	if !ok {
		return "", fmt.Errorf("%w: %s is not a text key", ErrInvalid, key)
	}
	return *s, nil
}

// Set assigns a value given as text to the configuration key.
func (c *Config) Set(key, value string) error {
	p, ok := c.keys()[key]
	if !ok {
		return fmt.Errorf("%w: unknown key %q", ErrInvalid, key)
	}
	if key == "name" {
		c.NameGiven = true
	}
	switch p := p.(type) {
	case *string:
		*p = value
	case *Duration:
		d, err := ParseDuration(value)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, key, err)
		}
		*p = Duration(d)
	case *Bytes:
		b, err := ParseBytes(value)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, key, err)
		}
		*p = b
	case *int:
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: %s: %q is not a whole number ≥ 0", ErrInvalid, key, value)
		}
		*p = n
	case *[]string:
		*p = nil
		for _, v := range strings.Split(value, ",") {
			if v = strings.TrimSpace(v); v != "" {
				*p = append(*p, v)
			}
		}
	case *bool:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return fmt.Errorf("%w: %s: %q is not true or false", ErrInvalid, key, value)
		}
		*p = b
	case *map[string]string:
		*p = nil
		for _, kv := range strings.Split(value, ",") {
			if kv = strings.TrimSpace(kv); kv == "" {
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("%w: %s: %q is not name=path", ErrInvalid, key, kv)
			}
			if *p == nil {
				*p = map[string]string{}
			}
			(*p)[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return nil
}

// Validate checks every value and returns the first problem, naming the key and what to
// write instead.
func (c Config) Validate() error {
	if c.DataDir == "" {
		return fmt.Errorf("%w: data-dir is empty: set --data-dir to a directory meshnode may write", ErrInvalid)
	}
	if !ValidName(c.Name) {
		return fmt.Errorf("%w: name %q: a node name is lower-case letters, digits and '-', starting with a letter or digit, at most 63 characters", ErrInvalid, c.Name)
	}
	for _, a := range []struct{ key, value string }{
		{"client-addr", c.ClientAddr},
		{"cluster-addr", c.ClusterAddr},
		{"gossip-addr", c.GossipAddr},
		{"http-addr", c.HTTPAddr},
	} {
		if err := validAddr(a.value); err != nil {
			return fmt.Errorf("%w: %s %q: %v; write host:port, e.g. 127.0.0.1:4222", ErrInvalid, a.key, a.value, err)
		}
	}
	if err := validAddr(c.LeafAddr); c.LeafAddr != "" && err != nil {
		return fmt.Errorf("%w: leaf-addr %q: %v; write host:port, e.g. 0.0.0.0:7422 (empty: the node accepts no sites)", ErrInvalid, c.LeafAddr, err)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("%w: log-level %q: write debug, info, warn or error", ErrInvalid, c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("%w: log-format %q: write text or json", ErrInvalid, c.LogFormat)
	}
	if _, _, err := c.SyncPolicy(); err != nil {
		return fmt.Errorf("%w: sync %q: %v", ErrInvalid, c.Sync, err)
	}
	for name, path := range c.GitRepos {
		switch {
		case !ValidName(name):
			return fmt.Errorf("%w: git-repos: %q is not a repository name (lower-case letters, digits and '-'): manifests name it in build.from", ErrInvalid, name)
		case !filepath.IsAbs(path):
			return fmt.Errorf("%w: git-repos: %s=%q: write the bare repository's absolute path", ErrInvalid, name, path)
		}
	}
	for _, seat := range c.MeshSeats {
		if !slices.Contains(manifest.NodeHeldSeats, seat) {
			return fmt.Errorf("%w: mesh-seats: %q is not a seat a node holds itself; write some of %s (other mesh-* seats are held by modules that declare them)",
				ErrInvalid, seat, strings.Join(manifest.NodeHeldSeats, ", "))
		}
	}
	if c.Advertise != "" {
		if ip := net.ParseIP(c.Advertise); (ip == nil && !validHostname(c.Advertise)) || (ip != nil && ip.IsUnspecified()) {
			return fmt.Errorf("%w: advertise %q: the IP address or DNS name the other servers reach this node at, e.g. 10.0.0.2", ErrInvalid, c.Advertise)
		}
	}
	if c.DriftInterval < Duration(100*time.Millisecond) {
		return fmt.Errorf("%w: drift-interval %s: at least 100ms, e.g. 10s", ErrInvalid, c.DriftInterval)
	}
	if c.SnapshotInterval != 0 && c.SnapshotInterval < Duration(MinSnapshotInterval) {
		return fmt.Errorf("%w: snapshot-interval %s: at least %s, e.g. 24h (0: no scheduled snapshots)", ErrInvalid, c.SnapshotInterval, Duration(MinSnapshotInterval))
	}
	if c.SnapshotKeep < 1 {
		return fmt.Errorf("%w: snapshot-keep %d: how many scheduled snapshots to keep, at least 1, e.g. 7", ErrInvalid, c.SnapshotKeep)
	}
	if c.SnapshotDir != "" && !filepath.IsAbs(c.SnapshotDir) {
		return fmt.Errorf("%w: snapshot-dir %q: write an absolute path, e.g. /var/backups/meshnode (\"\": <data-dir>/snapshots)", ErrInvalid, c.SnapshotDir)
	}
	if c.ProvisionInterval < Duration(time.Second) {
		return fmt.Errorf("%w: provision-interval %s: at least 1s, e.g. 1m", ErrInvalid, c.ProvisionInterval)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("%w: shutdown-timeout %s: must be positive, e.g. 5s", ErrInvalid, c.ShutdownTimeout)
	}
	if c.AuditRetention < 0 {
		return fmt.Errorf("%w: audit-retention %s: zero keeps everything, or write e.g. 90d", ErrInvalid, c.AuditRetention)
	}
	switch c.ClientTLS {
	case "", "auto", "always":
	default:
		return fmt.Errorf("%w: client-tls %q: auto (TLS when client-addr is not loopback) or always", ErrInvalid, c.ClientTLS)
	}
	if c.EventsMaxAge <= 0 {
		return fmt.Errorf("%w: events-max-age %s: must be positive, e.g. 7d", ErrInvalid, c.EventsMaxAge)
	}
	if c.StoreMaxBytes != 0 && c.StoreMaxBytes < MinStoreBytes {
		return fmt.Errorf("%w: store-max-bytes %s: the mesh needs at least %s (its control plane alone keeps some)", ErrInvalid, c.StoreMaxBytes, Bytes(MinStoreBytes))
	}
	if c.StoreMaxBytes != 0 && c.EventsMaxBytes+c.DeadMaxBytes > c.StoreMaxBytes*3/4 {
		return fmt.Errorf("%w: events-max-bytes %s and dead-max-bytes %s leave too little of store-max-bytes %s for the control plane and seat queues: keep them under three quarters of it", ErrInvalid, c.EventsMaxBytes, c.DeadMaxBytes, c.StoreMaxBytes)
	}
	if c.EmitRate < 0 {
		return fmt.Errorf("%w: emit-rate %d: events and jobs a second, ≥ 0 (0: no pace)", ErrInvalid, c.EmitRate)
	}
	if c.AuditMaxLag < 0 {
		return fmt.Errorf("%w: audit-max-lag %d: events, ≥ 0 (0: no back-pressure)", ErrInvalid, c.AuditMaxLag)
	}
	if c.DeadMaxBytesPerConsumer != 0 && c.DeadMaxBytesPerConsumer < MinDeadBytesPerConsumer {
		return fmt.Errorf("%w: dead-max-bytes-per-consumer %s: at least %s (a dead letter's headers alone take a few hundred bytes), or 0 for a 16384th of DEAD", ErrInvalid, c.DeadMaxBytesPerConsumer, Bytes(MinDeadBytesPerConsumer))
	}
	if c.DeadMaxBytes != 0 && c.DeadMaxBytesPerConsumer > c.DeadMaxBytes {
		return fmt.Errorf("%w: dead-max-bytes-per-consumer %s is more than dead-max-bytes %s: one consumer's share is a part of DEAD; lower it or raise dead-max-bytes", ErrInvalid, c.DeadMaxBytesPerConsumer, c.DeadMaxBytes)
	}
	if c.RateLimit < 0 {
		return fmt.Errorf("%w: rate-limit %d: requests a second, ≥ 0 (0: no limit)", ErrInvalid, c.RateLimit)
	}
	if c.FloodRate < 0 {
		return fmt.Errorf("%w: flood-rate %d: messages a second, ≥ 0 (0: not watched)", ErrInvalid, c.FloodRate)
	}
	if c.FloodBar < Duration(time.Second) || c.FloodBarMax < c.FloodBar {
		return fmt.Errorf("%w: flood-bar %s, flood-bar-max %s: at least 1s, and the longest at least the first, e.g. 10s and 10m", ErrInvalid, c.FloodBar, c.FloodBarMax)
	}
	switch c.Isolation {
	case "", IsolationFull, IsolationReduced:
	default:
		return fmt.Errorf("%w: isolation %q: full (modules run only fully isolated) or reduced (with what the machine gives)", ErrInvalid, c.Isolation)
	}
	if c.ModuleUIDs != "" {
		if _, _, err := c.UIDRange(); err != nil {
			return err
		}
	}
	for _, p := range c.BuildPaths {
		if !filepath.IsAbs(p) || filepath.Clean(p) == "/" {
			return fmt.Errorf("%w: build-paths %q: an absolute directory a build may read, not the root, e.g. /opt/jdk-21", ErrInvalid, p)
		}
	}
	if c.ModuleMemory != 0 && c.ModuleMemory < 8<<20 {
		return fmt.Errorf("%w: module-memory %s: at least 8MiB, or 0 for no limit", ErrInvalid, c.ModuleMemory)
	}
	if c.MaxEventBytes != 0 && c.MaxEventBytes < 1024 {
		return fmt.Errorf("%w: max-event-bytes %s: at least 1KiB (an event's headers alone take a few hundred bytes)", ErrInvalid, c.MaxEventBytes)
	}
	return nil
}

func validAddr(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("not host:port")
	}
	if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
		return fmt.Errorf("host %q is neither an IP address nor a host name", host)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// hostnameRE is a hostname's characters; its length, at most 253, is checked apart (see
// nameRE: {0,252} would hold 83 KB).
var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]*$`)

func validHostname(s string) bool { return len(s) <= 253 && hostnameRE.MatchString(s) }

// SyncPolicy reads Sync: always, or the interval of JetStream's background flush.
func (c Config) SyncPolicy() (always bool, every time.Duration, err error) {
	switch c.Sync {
	case "always":
		return true, 0, nil
	case "":
		c.Sync = DefaultSync
	}
	d, err := ParseDuration(c.Sync)
	if err != nil || d < time.Second || d > time.Hour {
		return false, 0, errors.New("write always (an fsync before each ack) or an interval from 1s to 1h, e.g. 2m (the default)")
	}
	return false, d, nil
}
