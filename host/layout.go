package host

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sandbox"
)

// A module's directory, <Dir>/<module>, is the node's; the module may read what it must and
// write only its own work directory (DESIGN §13):
//
//	artifact-<digest>  its program: read and executed (0555)
//	creds.nk           its seed: 0400, its uid's
//	secrets/           its secrets: the directory 0550 the node's (its group the module's), each 0400 its uid's
//	ca.pem             the mesh's CA, when the bus is TLS (0444)
//	work/              its own (0700, its uid's): working directory, HOME, TMPDIR=work/tmp
//	output.log, provisions.json, preparing, prepared: the node's alone
//
// When the node is root the directory is 0710 to the module's group, so its uid reaches its
// files and no other uid lists it; otherwise 0700, and Landlock alone keeps modules apart.
const workDirName = "work"

// user is the uid module runs as: nil when the node is not root (it runs as the node's user).
func (s *Supervisor) user(module string) (*sandbox.User, error) {
	if s.Users == nil {
		return nil, nil
	}
	u, err := s.Users.For(module)
	if err != nil {
		return nil, fmt.Errorf("a uid for %s: %w", module, err)
	}
	return u, nil
}

// moduleDir makes the module's directory, its group the module's when it has a user.
func moduleDir(dir string, u *sandbox.User) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if u == nil {
		return os.Chmod(dir, 0o700)
	}
	// The modules' directory: passed through by every module's uid, listed by none.
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		return err
	}
	if err := os.Lchown(dir, 0, u.GID); err != nil {
		return err
	}
	return os.Chmod(dir, 0o710)
}

// give makes a file or directory the node wrote beneath the module's directory readable by
// the module's user alone (0400, a directory 0500); without a user it stays the node's.
func give(path string, u *sandbox.User) error {
	if u == nil {
		return nil
	}
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	mode := os.FileMode(0o400)
	if st.IsDir() {
		mode = 0o500
	}
	if err := os.Lchown(path, u.UID, u.GID); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

// workDir makes the module's work directory and its tmp, owned by its user, and returns the
// work directory. The module may have replaced anything inside it (tmp by a link to a
// file of the node's, say): what the node makes there it makes beneath the directory
// (os.Root), and it changes the owner of nothing it did not just make.
func (s *Supervisor) workDir(dir string, u *sandbox.User) (string, error) {
	work := filepath.Join(dir, workDirName)
	switch err := os.Mkdir(work, 0o700); {
	case err == nil:
		if u != nil {
			if err := os.Lchown(work, u.UID, u.GID); err != nil {
				return "", err
			}
		}
	case !errors.Is(err, os.ErrExist):
		return "", err
	}
	if st, err := os.Lstat(work); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", work)
	}
	root, err := os.OpenRoot(work)
	if err != nil {
		return "", err
	}
	defer root.Close()
	switch err := root.Mkdir("tmp", 0o700); {
	case err == nil:
		if u != nil {
			if err := root.Lchown("tmp", u.UID, u.GID); err != nil {
				return "", err
			}
		}
	case !errors.Is(err, os.ErrExist):
		return "", err
	}
	return work, nil
}

// placeCA copies the mesh's CA certificate into the module's directory, where its sandbox
// lets it read it (the node's own copy is in the data dir, which it may not), and returns
// the copy's path.
//
// An unchanged copy is left as it is: a running instance's Landlock rule names the file it
// was started with, and a new file in its place would be one it may not read.
func placeCA(ca, dir string) (string, error) {
	b, err := os.ReadFile(ca)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "ca.pem")
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, b) {
		return path, nil
	}
	if err := writeSecret(path, string(b)); err != nil {
		return "", err
	}
	return path, os.Chmod(path, 0o444)
}

// own gives a prepared module's directory, seed and secrets to its user, when it has one.
func (s *Supervisor) own(module string) error {
	u, err := s.user(module)
	if err != nil || u == nil {
		return err
	}
	dir := filepath.Join(s.Dir, module)
	if err := moduleDir(dir, u); err != nil {
		return err
	}
	secrets := filepath.Join(dir, "secrets")
	entries, _ := os.ReadDir(secrets)
	for _, e := range entries {
		if err := give(filepath.Join(secrets, e.Name()), u); err != nil {
			return err
		}
	}
	if len(entries) > 0 {
		// The directory stays the node's (its group the module's): the module lists and
		// reads its secrets, and can neither plant nor remove an entry, nor change its mode.
		if err := os.Lchown(secrets, 0, u.GID); err != nil {
			return err
		}
		if err := os.Chmod(secrets, 0o550); err != nil {
			return err
		}
	}
	return give(filepath.Join(dir, "creds.nk"), u)
}

// limits are an instance's limits: the node's, lowered where its manifest asks for less. A
// manifest never raises one: the node's values (module-memory, module-processes,
// module-disk) are the most any module may use. Its cpu-weight is its share among the
// node's modules, which together have the share of one.
func (s *Supervisor) limits(m manifest.Limits) api.Limits {
	lower := func(node, asked int64) int64 {
		if asked > 0 && (node == 0 || asked < node) {
			return asked
		}
		return node
	}
	l := s.Limits
	l.Memory = lower(l.Memory, int64(m.Memory))
	l.Processes = int(lower(int64(l.Processes), int64(m.Processes)))
	l.Disk = lower(l.Disk, int64(m.Disk))
	if m.CPUWeight > 0 {
		l.CPUWeight = m.CPUWeight
	}
	return l
}
