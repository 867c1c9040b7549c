package sandbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
)

// The uids a root node gives its modules when not configured otherwise are 1,024 of its
// own (NodeUIDs), drawn by its data dir from 0x70000000–0x7FA3FFFF: above systemd's
// container ranges (which end at 0x6FFFFFFF), below its foreign range (0x7FFE0000) and below
// 2^31, where tools that keep a uid signed break. Two nodes on one machine do not share
// uids — one's restart would end the other's modules — unless their data dirs' hashes meet
// (one chance in 250,000). Within a range a uid that /etc/passwd names, or that a process
// runs as, is skipped.
const (
	nodeUIDBase   = 0x70000000
	nodeUIDRanges = 250000
	nodeUIDRange  = 1024
)

// The range the tests use: systemd's for dynamic users, whose uids no package owns.
const (
	DefaultFirstUID = 61184
	DefaultLastUID  = 65519
)

// NodeUIDs is the default range of uids of the node whose data dir is dataDir.
func NodeUIDs(dataDir string) (first, last int) {
	sum := sha256.Sum256([]byte(dataDir))
	n := int(binary.BigEndian.Uint32(sum[:4]) % nodeUIDRanges)
	first = nodeUIDBase + n*nodeUIDRange
	return first, first + nodeUIDRange - 1
}

// User is the uid and gid a module runs as (gid = uid: a group of its own).
type User struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
}

// Users allocates each module a uid of its own from a range, and records it in a file, so a
// module keeps its uid across restarts (its files stay its own) and a restarted node knows
// whose processes are its modules'.
type Users struct {
	path        string
	first, last int

	mu    sync.Mutex
	byKey map[string]int
}

// OpenUsers reads the record at path (a file of the node's, 0600), allocating from [first, last].
func OpenUsers(path string, first, last int) (*Users, error) {
	if first <= 0 || last < first {
		return nil, fmt.Errorf("module uids %d-%d: give a range of unprivileged uids, first-last", first, last)
	}
	u := &Users{path: path, first: first, last: last, byKey: map[string]int{}}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(b, &u.byKey); err != nil {
			return nil, fmt.Errorf("%s: %w (remove it: modules get new uids)", path, err)
		}
	}
	return u, nil
}

// For returns key's user, allocating one at its first use.
func (u *Users) For(key string) (*User, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if uid, ok := u.byKey[key]; ok && uid >= u.first && uid <= u.last {
		return &User{UID: uid, GID: uid}, nil
	}
	taken := map[int]bool{}
	for _, uid := range u.byKey {
		taken[uid] = true
	}
	running := processUIDs()
	for uid := u.first; uid <= u.last; uid++ {
		if taken[uid] || running[uid] {
			continue
		}
		if _, err := user.LookupId(strconv.Itoa(uid)); err == nil {
			continue // a user of the machine's
		}
		u.byKey[key] = uid
		if err := u.save(); err != nil {
			delete(u.byKey, key)
			return nil, err
		}
		return &User{UID: uid, GID: uid}, nil
	}
	return nil, fmt.Errorf("no free uid in %d-%d for %s: widen module-uids", u.first, u.last, key)
}

// Release forgets key's user (its module was removed, and its files with it).
func (u *Users) Release(key string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.byKey[key]; !ok {
		return nil
	}
	delete(u.byKey, key)
	return u.save()
}

func (u *Users) all() []int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Sorted(maps.Values(u.byKey))
}

func (u *Users) save() error {
	b, _ := json.Marshal(u.byKey)
	tmp := u.path + ".tmp"
	if err := os.MkdirAll(filepath.Dir(u.path), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, u.path)
}

// processUIDs are the real uids processes run as now.
func processUIDs() map[int]bool {
	uids := map[int]bool{}
	for _, st := range processes() {
		uids[st.uid] = true
	}
	return uids
}

// killUsers SIGKILLs every process running as one of uids, until none is left, and says how
// many it killed.
func killUsers(uids []int) int {
	if len(uids) == 0 {
		return 0
	}
	want := map[int]bool{}
	for _, uid := range uids {
		want[uid] = true
	}
	killed := 0
	for range 50 {
		found := 0
		for pid, st := range processes() {
			if want[st.uid] {
				syscall.Kill(pid, syscall.SIGKILL)
				found++
			}
		}
		if found == 0 {
			break
		}
		killed += found
	}
	return killed
}
