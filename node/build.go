package node

import (
	"context"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
)

// openBuildSeats opens the build cascade's seats' services (package build does their work)
// on s, idle until this node holds a seat; the seat service starts, stops and closes them.
func (n *Node) openBuildSeats(s *seatService) (err error) {
	cfg := build.Config{
		Node: n.id.Name, Responder: n.resp.nc, Conn: n.bus.Conn(), JetStream: n.bus.JetStream(), Replicas: n.replicas,
		Publish: func(ctx context.Context, seat, subject string, body []byte, causation string) error {
			return publishSigned(ctx, n.bus.JetStream(), n.sign, seat, n.id.Name, subject, body, envelope.Options{Causation: causation, SeatEpoch: s.heldEpoch(seat)})
		},
		Logger:   n.log,
		GitRepos: n.cfg.GitRepos, DB: n.db,
		NodeKey: func(node string) (string, bool) {
			id, ok := n.reg.Node(node)
			return id.PublicKey, ok
		},
		Manifest: func(module string) (*manifest.Manifest, bool) {
			e, ok := n.reg.Get(module)
			if !ok {
				return nil, false
			}
			return e.Manifest, true
		},
		DataDir: n.cfg.DataDir, Sandbox: n.mods.sandbox, Users: n.mods.users, Read: n.cfg.BuildPaths,
		Limits: api.Limits{Memory: int64(n.cfg.ModuleMemory), Processes: n.cfg.ModuleProcesses, Disk: int64(n.cfg.ModuleDisk)},
	}
	// Their work outlives Open (whose context ends when it returns): Close ends it.
	if s.git, err = build.OpenGit(context.Background(), cfg); err != nil {
		return err
	}
	s.builder = build.OpenBuilder(context.Background(), cfg)
	return nil
}
