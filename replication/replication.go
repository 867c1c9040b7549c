// Package replication keeps every stream of the mesh at the replication its number of servers
// calls for, and reports each stream's replicas and quorum.
//
// JetStream keeps at most five copies of a stream, and a replicated stream answers while a
// majority of its copies do: three copies survive one server down, five survive two. So a
// mesh of one server keeps one copy, of three or four keeps three, and of five or more keeps
// five (Target). Two servers (three, one removed) keep two: neither may be down for a write,
// but a lost disk loses nothing. Seven servers then tolerate any two down — not three: a stream placed on
// five of the seven loses its majority when three of its own five go.
//
// The servers are counted once, by the holder of the controller's seat, and Streams brings
// every stream of the account to the target: the registry, vault and leases buckets, EVENTS,
// DEAD, STATE, every seat's queue, the artifacts' and the sources' object stores, the
// provisions' buckets. nats-server moves each durable consumer along with its stream. The
// openers of streams (internal/ensure) create at the target and never change the replicas of
// a stream that exists: a node starting with an older count cannot undo a rescale.
package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/streammove"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxReplicas is JetStream's largest replication.
const MaxReplicas = 5

// Target is the replication of the mesh's streams with servers servers: 1 for one, 2 for
// two, 3 for three or four, 5 from five.
func Target(servers int) int {
	switch {
	case servers >= MaxReplicas:
		return MaxReplicas
	case servers >= 3:
		return 3
	default:
		return max(servers, 1)
	}
}

// Tolerates is how many servers of a mesh at replication replicas may be down while every
// stream keeps a majority of its copies.
func Tolerates(replicas int) int { return (replicas - 1) / 2 }

// Streams brings every stream of js's account to replicas, one update a stream, and returns
// the names of those it asked to change. A stream being restored into the mesh (package
// streammove sets its replicas itself) is left alone, and so is one whose previous change is
// still under way (nats-server takes one at a time). A stream that cannot change now — too few
// servers answer to place its copies, or it has no leader — is named in the error; the others
// are still changed, and the next call tries again.
func Streams(ctx context.Context, js jetstream.JetStream, replicas int) (changed []string, err error) {
	if replicas < 1 || replicas > MaxReplicas {
		return nil, fmt.Errorf("replication %d: JetStream keeps 1 to %d copies", replicas, MaxReplicas)
	}
	var infos []*jetstream.StreamInfo
	list := js.ListStreams(ctx)
	for info := range list.Info() {
		infos = append(infos, info)
	}
	if err := list.Err(); err != nil {
		return nil, fmt.Errorf("list the streams: %w", err)
	}
	var errs []error
	for _, info := range infos {
		cfg := info.Config
		if cfg.Replicas == replicas || cfg.Metadata[streammove.RestoringMeta] != "" ||
			info.Cluster != nil && info.Cluster.Desired != nil {
			continue
		}
		cfg.Replicas = replicas
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			errs = append(errs, fmt.Errorf("%s from %d to %d copies: %w", cfg.Name, info.Config.Replicas, replicas, err))
			continue
		}
		changed = append(changed, cfg.Name)
	}
	if len(errs) > 0 {
		return changed, fmt.Errorf("replicate the mesh's streams: %w", errors.Join(errs...))
	}
	return changed, nil
}

// Report is every stream of js's account with its replication: what its configuration asks,
// how many copies are current, and whether it has a quorum now. A stream whose leader does
// not answer the listing (it has no majority to elect one) is reported without quorum.
func Report(ctx context.Context, js jetstream.JetStream) ([]api.StreamReplication, error) {
	names, err := listNames(ctx, js)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []api.StreamReplication
	list := js.ListStreams(ctx)
	for info := range list.Info() {
		seen[info.Config.Name] = true
		out = append(out, streamReplication(info))
	}
	// A stream without a leader is missing from the listing: its absence is the answer, so
	// the listing's error (it names the missing streams) is not one.
	for _, name := range names {
		if !seen[name] {
			out = append(out, api.StreamReplication{Name: name, Why: "no leader answers: fewer than a majority of its copies are up"})
		}
	}
	slices.SortFunc(out, func(a, b api.StreamReplication) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func listNames(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var names []string
	list := js.StreamNames(ctx)
	for name := range list.Name() {
		names = append(names, name)
	}
	if err := list.Err(); err != nil {
		return nil, fmt.Errorf("list the streams (the JetStream meta group answers it, so it needs a majority of the servers): %w", err)
	}
	return names, nil
}

// streamReplication reads one stream's replication from its leader's answer.
func streamReplication(info *jetstream.StreamInfo) api.StreamReplication {
	r := api.StreamReplication{Name: info.Config.Name, Replicas: max(info.Config.Replicas, 1)}
	c := info.Cluster
	if c != nil {
		r.Leader = c.Leader
	}
	if c == nil || r.Replicas == 1 {
		// One copy (or a standalone server): the server that answered holds it.
		r.Current, r.Quorum = 1, true
		return r
	}
	if r.Leader != "" {
		r.Current = 1
	}
	for _, p := range c.Replicas {
		if p.Current && !p.Offline && !p.Pending {
			r.Current++
		} else {
			r.Behind = append(r.Behind, p.Name)
		}
	}
	r.Quorum = r.Leader != "" && r.Current > r.Replicas/2
	switch {
	case r.Leader == "":
		r.Why = "no leader"
	case !r.Quorum:
		r.Why = fmt.Sprintf("%d of %d copies current, a majority is %d", r.Current, r.Replicas, r.Replicas/2+1)
	}
	return r
}
