package streammove

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// manifestFile is the manifest's name in the snapshots' directory.
const manifestFile = "manifest.json"

// Manifest is what a directory of snapshots holds: each stream's configuration and state,
// in the order SnapshotAll took them and Restore should restore them.
type Manifest struct {
	Streams []Stream `json:"streams"`
}

// Stream is one stream's snapshot, in <dir>/<name>.snap.
type Stream struct {
	Config server.StreamConfig `json:"config"`
	State  server.StreamState  `json:"state"`
	// Consumers are the stream's durable consumers, whose state the snapshot holds.
	Consumers []string `json:"consumers,omitempty"`
}

// ReadManifest reads the manifest SnapshotAll wrote into dir.
func ReadManifest(dir string) (Manifest, error) {
	var man Manifest
	b, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err == nil {
		err = json.Unmarshal(b, &man)
	}
	return man, err
}

// SnapshotAll writes a snapshot of every stream of nc's account into dir, and the manifest
// that ReadManifest reads: stream last after every other, as Restore should restore it (the
// one that others wait for, see RestoringMeta), "" for none. Nothing else may change the
// streams meanwhile (their durable consumers are listed after each snapshot).
func SnapshotAll(ctx context.Context, nc *nats.Conn, dir, last string, log *slog.Logger) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var names []string
	for name := range js.StreamNames(ctx).Name() {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == last:
			return 1
		case b == last:
			return -1
		}
		return strings.Compare(a, b)
	})
	var man Manifest
	for _, name := range names {
		s, err := snapshotToFile(ctx, nc, dir, name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		log.Info("snapshot taken", "stream", name, "messages", s.State.Msgs, "last_seq", s.State.LastSeq)
		man.Streams = append(man.Streams, s)
	}
	b, err := json.Marshal(man)
	if err != nil {
		return err
	}
	return writeSynced(filepath.Join(dir, manifestFile), b)
}

// snapshotToFile writes the snapshot of stream name to dir/<name>.snap, synced.
func snapshotToFile(ctx context.Context, nc *nats.Conn, dir, name string) (Stream, error) {
	f, err := os.OpenFile(filepath.Join(dir, name+".snap"), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return Stream{}, err
	}
	defer f.Close()
	s, err := SnapshotStream(ctx, nc, name, f)
	if err != nil {
		return Stream{}, err
	}
	return s, f.Sync()
}

// SnapshotStream writes the snapshot of stream name to w, as Restore reads it from
// <dir>/<name>.snap ($JS.API.STREAM.SNAPSHOT: chunks to an inbox, each acknowledged, an
// empty message last), and returns the stream's configuration and state at the snapshot and
// its durable consumers, listed after it. The server goes on serving the stream meanwhile.
func SnapshotStream(ctx context.Context, nc *nats.Conn, name string, w io.Writer) (Stream, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return Stream{}, err
	}
	defer sub.Unsubscribe()
	req, _ := json.Marshal(server.JSApiStreamSnapshotRequest{DeliverSubject: inbox, ChunkSize: 128 << 10})
	msg, err := nc.RequestWithContext(ctx, fmt.Sprintf(server.JSApiStreamSnapshotT, name), req)
	if err != nil {
		return Stream{}, err
	}
	var resp server.JSApiStreamSnapshotResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return Stream{}, err
	}
	if resp.Error != nil {
		return Stream{}, resp.Error
	}
	if resp.Config == nil || resp.State == nil {
		return Stream{}, fmt.Errorf("the server answered the snapshot of %s without its configuration or state", name)
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return Stream{}, fmt.Errorf("snapshot chunk: %w", err)
		}
		if len(m.Data) == 0 {
			if status := m.Header.Get("Status"); status != "" && status != "204" {
				return Stream{}, fmt.Errorf("snapshot ended with %s %s", status, m.Header.Get("Description"))
			}
			break
		}
		if _, err := w.Write(m.Data); err != nil {
			return Stream{}, err
		}
		if m.Reply != "" {
			m.Respond(nil) // flow control: the next chunk
		}
	}
	// Its durable consumers, which the restore must bring back. On the standalone server a
	// node grows from nothing else changes them while it snapshots; on a live mesh (a
	// backup) one made or removed meanwhile may differ, and Restore gives up one that
	// never comes.
	g := Stream{Config: *resp.Config, State: *resp.State}
	js, err := jetstream.New(nc)
	if err != nil {
		return Stream{}, err
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return Stream{}, err
	}
	consumers := st.ListConsumers(ctx)
	for ci := range consumers.Info() {
		// One that may go when idle (its own inactivity threshold, or the stream's) may
		// rightly be gone by the time the mesh registers it.
		if ci.Config.Durable != "" && ci.Config.InactiveThreshold == 0 && resp.Config.ConsumerLimits.InactiveThreshold == 0 {
			g.Consumers = append(g.Consumers, ci.Name)
		}
	}
	if err := consumers.Err(); err != nil {
		return Stream{}, fmt.Errorf("list the consumers of %s: %w", name, err)
	}
	slices.Sort(g.Consumers)
	return g, nil
}

// writeSynced writes data to path and syncs it, as each snapshot is. Not through a temporary
// file and a rename: whoever moves streams records that the snapshots are whole only after
// SnapshotAll returns, and takes them again from the start otherwise.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
