package build

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/sandbox"
)

// Job is the mesh-build-machine seat's `build` verb: build Module from Path of Repository at
// Commit. Reason says why (a push, or the new artifact of a module it is built on); Cascade
// names the cascade it belongs to (the event that started it).
type Job struct {
	Module     string `json:"module"`
	Repository string `json:"repository"`
	Path       string `json:"path"`
	Commit     string `json:"commit"`
	Reason     string `json:"reason"`
	Cascade    string `json:"cascade,omitempty"`
}

// Built is the seat's `built` event; Failed its `failed` event.
type Built struct {
	Module  string `json:"module"`
	Version string `json:"version"`
	Digest  string `json:"digest"`
	Commit  string `json:"commit"`
	Cascade string `json:"cascade,omitempty"`
}

// Failed says a build did not produce an artifact, with the end of its output.
type Failed struct {
	Module  string `json:"module"`
	Commit  string `json:"commit"`
	Reason  string `json:"reason"`
	Log     string `json:"log,omitempty"`
	Cascade string `json:"cascade,omitempty"`
}

// LogTail is how much of a failed build's output its event carries.
const LogTail = 4 << 10

// Spec is one build to run: the job, the command, the checked-out tree (a tar archive), and
// the artifacts of the modules it is built on (by module name).
type Spec struct {
	Job     Job
	Run     string
	Source  io.Reader
	Deps    map[string]io.Reader
	Timeout time.Duration
	// Sandbox runs the command isolated (DESIGN §13), as User (nil: the node's user). The
	// build reads its tree, its deps, the system's runtime and Read (a toolchain's paths),
	// and writes its tree, $OUT, $HOME and Cache (a cache of the builder's own, kept
	// between builds: GOCACHE, GOMODCACHE, npm's).
	Sandbox *sandbox.Sandbox
	User    *sandbox.User
	Read    []string
	Cache   string
	Limits  api.Limits
}

// Run builds spec in a fresh directory under dir: the tree is unpacked beneath dir/src (no
// entry, and no chain of links, lands outside it), the deps are put in $DEPS/<module>, and
// run is executed by sh in the module's path, sandboxed, with a clean environment (PATH,
// HOME, OUT, MODULE, COMMIT, DEPS, TMPDIR, and the Go toolchain's caches in Cache), killed
// with everything it started at the time limit. It returns the artifact's path (inside dir,
// a file of the node's; the caller removes dir) and the end of the output.
func Run(ctx context.Context, dir string, spec Spec) (artifact string, output []byte, err error) {
	if spec.Sandbox == nil {
		return "", nil, errors.New("the node has no sandbox to build in")
	}
	src := filepath.Join(dir, "src")
	if err := unpack(spec.Source, src); err != nil {
		return "", nil, fmt.Errorf("unpack the source of %s at %s: %w", spec.Job.Repository, spec.Job.Commit, err)
	}
	deps := filepath.Join(dir, "deps")
	if err := os.MkdirAll(deps, 0o700); err != nil {
		return "", nil, err
	}
	for name, r := range spec.Deps {
		if err := writeFile(filepath.Join(deps, name), r, 0o700); err != nil {
			return "", nil, fmt.Errorf("dependency %s: %w", name, err)
		}
	}
	work := filepath.Join(src, filepath.FromSlash(spec.Job.Path))
	if rel, err := filepath.Rel(src, work); err != nil || strings.HasPrefix(rel, "..") {
		return "", nil, fmt.Errorf("path %q leaves the repository", spec.Job.Path)
	}
	// The path as the kernel resolves it, through any link the tree holds, must be a
	// directory of the tree: the launcher enters it before it drops to the build's user.
	if real, err := filepath.EvalSymlinks(work); err != nil || !within(src, real) {
		return "", nil, fmt.Errorf("%s has no directory %s at %s (a link out of the tree is not followed)", spec.Job.Repository, spec.Job.Path, spec.Job.Commit)
	}
	if st, err := os.Lstat(work); err != nil || !st.IsDir() {
		return "", nil, fmt.Errorf("%s has no directory %s at %s", spec.Job.Repository, spec.Job.Path, spec.Job.Commit)
	}
	outDir, home := filepath.Join(dir, "out"), filepath.Join(dir, "home")
	for _, d := range []string{outDir, home, filepath.Join(home, "tmp")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return "", nil, err
		}
	}
	write := []string{src, outDir, home}
	if err := giveTree(dir, spec.User, write, []string{deps}); err != nil {
		return "", nil, fmt.Errorf("give the build its files: %w", err)
	}
	if spec.Cache != "" {
		if err := os.MkdirAll(spec.Cache, 0o700); err != nil {
			return "", nil, err
		}
		if spec.User != nil {
			// The caches' directory: passed through by each module's build user, listed by none.
			if err := os.Chmod(filepath.Dir(spec.Cache), 0o711); err != nil {
				return "", nil, err
			}
			if err := os.Lchown(spec.Cache, spec.User.UID, spec.User.GID); err != nil {
				return "", nil, err
			}
		}
		write = append(write, spec.Cache)
	}
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	env := []string{"PATH=/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "TMPDIR=" + filepath.Join(home, "tmp"),
		"OUT=" + filepath.Join(outDir, "artifact"), "MODULE=" + spec.Job.Module, "COMMIT=" + spec.Job.Commit, "DEPS=" + deps}
	if spec.Cache != "" {
		env = append(env, "GOCACHE="+filepath.Join(spec.Cache, "go-build"), "GOMODCACHE="+filepath.Join(spec.Cache, "go-mod"),
			"GOPATH="+filepath.Join(spec.Cache, "go"), "npm_config_cache="+filepath.Join(spec.Cache, "npm"))
	}
	var buf tail
	p, err := spec.Sandbox.Start(sandbox.Proc{
		Name: "build-" + filepath.Base(dir), Path: "/bin/sh", Args: []string{"-c", spec.Run}, Env: env, Dir: work,
		Read: append([]string{deps}, spec.Read...), Write: write, User: spec.User, Limits: spec.Limits, DiskDir: dir,
		Stdout: &buf, Stderr: &buf, WaitDelay: time.Second,
	})
	if err != nil {
		return "", nil, fmt.Errorf("start the build: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- p.Wait() }()
	select {
	case err = <-exited:
	case <-cctx.Done():
		p.Kill()
		<-exited
		return "", buf.Bytes(), fmt.Errorf("the build took longer than %s", timeout)
	}
	if cause := p.Cause(); cause != "" {
		return "", buf.Bytes(), fmt.Errorf("the build was ended: %s", cause)
	}
	if err != nil {
		return "", buf.Bytes(), fmt.Errorf("run %q: %w", spec.Run, err)
	}
	artifact = filepath.Join(dir, "artifact")
	if err := takeArtifact(outDir, artifact); err != nil {
		return "", buf.Bytes(), err
	}
	return artifact, buf.Bytes(), nil
}

// within reports whether path is dir or beneath it (both with no link left in them).
func within(dir, path string) bool {
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false
	}
	rel, err := filepath.Rel(realDir, path)
	return err == nil && filepath.IsLocal(rel) || rel == "."
}

// takeArtifact copies $OUT/artifact, which the build wrote, to a file of the node's at dst.
// The build may have left anything there — a link to a seed of the node's, a directory, a
// fifo — so the file is opened beneath out without following a link, and must be a regular
// file.
func takeArtifact(out, dst string) error {
	root, err := os.OpenRoot(out)
	if err != nil {
		return err
	}
	defer root.Close()
	if st, err := root.Lstat("artifact"); err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
		return errors.New("the build wrote no artifact to $OUT (a regular file, not empty, not a link)")
	}
	f, err := root.OpenFile("artifact", os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open the artifact: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return errors.New("the build's $OUT/artifact is not a regular file")
	}
	return writeFile(dst, f, 0o755)
}

// giveTree makes the build's writable directories its user's (every entry beneath them,
// links themselves, not their targets), and lets it pass through dir and read ro.
func giveTree(dir string, u *sandbox.User, rw, ro []string) error {
	if u == nil {
		return nil
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	for _, top := range rw {
		err := filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, u.UID, u.GID)
		})
		if err != nil {
			return err
		}
	}
	for _, top := range ro {
		err := filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				return os.Chmod(path, 0o755)
			}
			return os.Chmod(path, 0o555)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// tail keeps the last LogTail bytes written to it, and how many it dropped before them: a
// build that prints without end costs the node no more.
type tail struct {
	mu      sync.Mutex
	buf     []byte
	dropped int64
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - LogTail; over > 0 {
		t.dropped += int64(over)
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// Bytes is the kept end, after a line saying how much came before it, if any was cut.
func (t *tail) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dropped == 0 {
		return append([]byte(nil), t.buf...)
	}
	return append([]byte(fmt.Sprintf("[%d earlier bytes of output cut; the last %d follow]\n", t.dropped, len(t.buf))), t.buf...)
}

// Tail returns the end of a build's output, at most LogTail bytes (and a line saying so when
// it was cut).
func Tail(output []byte) string {
	if len(output) > LogTail+128 {
		return fmt.Sprintf("[%d earlier bytes of output cut; the last %d follow]\n", len(output)-LogTail, LogTail) + string(output[len(output)-LogTail:])
	}
	return string(output)
}

// unpack extracts a tar archive into dir, beneath it: every entry is made through an
// os.Root, so no entry — and no chain of links however built, relative, absolute or through
// "..", — reaches outside dir. A link whose target, read as written, leaves the tree is
// refused at once; one that leaves it only through another link is made, and the build,
// under Landlock, cannot read what it names.
func unpack(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			// The archive's end is not the stream's: reading the padding after it to the end
			// lets the source's reader check the stored digest and finish its delivery.
			_, err := io.Copy(io.Discard, r)
			return err
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(filepath.FromSlash(h.Name))
		if !filepath.IsLocal(name) {
			return fmt.Errorf("entry %q leaves the tree", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return fmt.Errorf("entry %q: %w", h.Name, err)
			}
		case tar.TypeReg:
			mode := os.FileMode(0o600)
			if h.Mode&0o111 != 0 {
				mode = 0o700
			}
			if err := rootWrite(root, name, tr, mode); err != nil {
				return fmt.Errorf("entry %q: %w", h.Name, err)
			}
		case tar.TypeSymlink:
			if filepath.IsAbs(h.Linkname) || !filepath.IsLocal(filepath.Join(filepath.Dir(name), h.Linkname)) {
				return fmt.Errorf("link %q leaves the tree", h.Name)
			}
			if d := filepath.Dir(name); d != "." {
				if err := root.MkdirAll(d, 0o700); err != nil {
					return fmt.Errorf("entry %q: %w", h.Name, err)
				}
			}
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("entry %q: %w", h.Name, err)
			}
		}
	}
}

// rootWrite writes r to name beneath root.
func rootWrite(root *os.Root, name string, r io.Reader, mode os.FileMode) error {
	if d := filepath.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	f, err := root.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	return copyInto(f, r)
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	return copyInto(f, r)
}

// copyInto copies r into f, and closes it.
func copyInto(f *os.File, r io.Reader) error {
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
