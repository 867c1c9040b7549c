package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// InfoFile is written to the data dir while a node runs, so client verbs find it from
// --data-dir alone without opening the store (which the node holds locked).
const InfoFile = "node.json"

// ErrNotRunning means no node is running on a data dir.
var ErrNotRunning = errors.New("no meshnode is running")

// Info is the content of node.json: where a running node listens.
type Info struct {
	Name        string    `json:"name"`
	MeshID      string    `json:"mesh_id"`
	PID         int       `json:"pid"`
	Version     string    `json:"version"`
	ClientURL   string    `json:"client_url"`
	HTTPURL     string    `json:"http_url"`
	ClusterAddr string    `json:"cluster_addr"`
	GossipAddr  string    `json:"gossip_addr"`
	Started     time.Time `json:"started"`
	// Forming says what a clustered node waits for before its bus starts (its client and
	// HTTP addresses are empty until then).
	Forming string `json:"forming,omitempty"`
}

// ReadInfo reads node.json from dataDir. A missing file means no node runs there.
func ReadInfo(dataDir string) (Info, error) {
	path := filepath.Join(dataDir, InfoFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("%w with data dir %s (no %s); start one with `meshnode up --data-dir %s`", ErrNotRunning, dataDir, InfoFile, dataDir)
	}
	if err != nil {
		return Info{}, fmt.Errorf("read %s: %w", path, err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("read %s: %w; it is rewritten when the node starts", path, err)
	}
	return info, nil
}

// WriteInfo writes node.json to dataDir.
func WriteInfo(dataDir string, info Info) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(filepath.Join(dataDir, InfoFile), append(b, '\n'), 0o644)
}

// RemoveInfo deletes node.json if it is still this process's.
func RemoveInfo(dataDir string) {
	path := filepath.Join(dataDir, InfoFile)
	if info, err := ReadInfo(dataDir); err == nil && info.PID == os.Getpid() {
		os.Remove(path)
	}
}
