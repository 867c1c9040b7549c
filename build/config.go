package build

import (
	"context"
	"log/slog"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sandbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// Config is what the cascade's seats take from their node: its name, connections, store and
// sandbox, and the few things they ask of the node (Publish) and of the registry (NodeKey,
// Manifest). Git uses the first group, GitRepos and DB; Builder the first group and the
// rest.
type Config struct {
	// Node is this node's name.
	Node string
	// Responder answers the seats' tools and the node's git-notify tool: it may publish only
	// to inboxes.
	Responder *nats.Conn
	// Conn asks the mesh-git holder for a build's source.
	Conn *nats.Conn
	// JetStream holds the build queue, mesh-sources and mesh-artifacts.
	JetStream jetstream.JetStream
	// Replicas is the replication mesh-sources is made with when it is missing; it is asked
	// each time, as a mesh grows.
	Replicas func() int
	// Publish stores one of the seats' events in its stream: body on subject, with x-source
	// seat, signed by the node, caused by causation ("": none).
	Publish func(ctx context.Context, seat, subject string, body []byte, causation string) error
	// Logger logs what the seats do and what goes wrong in the background.
	Logger *slog.Logger

	// GitRepos are the bare repositories the mesh-git holder serves, by name (nil: none).
	GitRepos map[string]string
	// DB keeps the commit last told for each branch, so a restart tells no push twice.
	DB *bolt.DB

	// NodeKey returns the public key of a server of the mesh: a build job is taken only
	// signed by the server it names.
	NodeKey func(node string) (publicKey string, ok bool)
	// Manifest returns a registered module's manifest: its build.from, build.on, build.run.
	Manifest func(module string) (*manifest.Manifest, bool)
	// DataDir holds the builds' working directories and caches.
	DataDir string
	// Sandbox runs the builds (nil: each build fails, saying the node has no sandbox).
	Sandbox *sandbox.Sandbox
	// Users gives each module's builds a uid of their own (nil: builds run as the node's
	// user, which is not root).
	Users *sandbox.Users
	// Read are the paths a build may read besides the system's runtime (a toolchain's).
	Read []string
	// Limits bound one build as they bound one module instance.
	Limits api.Limits
}
