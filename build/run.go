package build

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
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
}

// Run builds spec in a fresh directory under dir: the tree is unpacked, the deps are put in
// $DEPS/<module>, and run is executed by sh in the module's path with a clean environment
// (PATH, HOME, OUT, MODULE, COMMIT, DEPS), in its own process group, killed at the time
// limit. It returns the artifact's path (inside dir; the caller removes dir) and the output.
func Run(ctx context.Context, dir string, spec Spec) (artifact string, output []byte, err error) {
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
	if st, err := os.Stat(work); err != nil || !st.IsDir() {
		return "", nil, fmt.Errorf("%s has no directory %s at %s", spec.Job.Repository, spec.Job.Path, spec.Job.Commit)
	}
	out := filepath.Join(dir, "out", "artifact")
	os.MkdirAll(filepath.Dir(out), 0o700)
	home := filepath.Join(dir, "home")
	os.MkdirAll(home, 0o700)
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, "/bin/sh", "-c", spec.Run)
	cmd.Dir = work
	cmd.Env = []string{"PATH=/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "OUT=" + out,
		"MODULE=" + spec.Job.Module, "COMMIT=" + spec.Job.Commit, "DEPS=" + deps}
	if gocache := os.Getenv("GOCACHE"); gocache != "" {
		cmd.Env = append(cmd.Env, "GOCACHE="+gocache) // a Go toolchain's build cache, when the node has one
	}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	err = cmd.Run()
	switch {
	case cctx.Err() == context.DeadlineExceeded:
		return "", buf.Bytes(), fmt.Errorf("the build took longer than %s", timeout)
	case err != nil:
		return "", buf.Bytes(), fmt.Errorf("run %q: %w", spec.Run, err)
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		return "", buf.Bytes(), errors.New("the build wrote no artifact to $OUT")
	}
	if err := os.Chmod(out, 0o755); err != nil {
		return "", buf.Bytes(), err
	}
	return out, buf.Bytes(), nil
}

// Tail returns the end of a build's output, at most LogTail bytes.
func Tail(output []byte) string {
	if len(output) > LogTail {
		output = output[len(output)-LogTail:]
	}
	return string(output)
}

// unpack extracts a tar archive into dir, refusing entries that would land outside it.
func unpack(r io.Reader, dir string) error {
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
		target := filepath.Join(dir, filepath.FromSlash(h.Name))
		if rel, err := filepath.Rel(dir, target); err != nil || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("entry %q leaves the tree", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			mode := os.FileMode(0o600)
			if h.Mode&0o111 != 0 {
				mode = 0o700
			}
			if err := writeFile(target, tr, mode); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if filepath.IsAbs(h.Linkname) || strings.HasPrefix(filepath.Clean(filepath.Join(filepath.Dir(h.Name), h.Linkname)), "..") {
				return fmt.Errorf("link %q leaves the tree", h.Name)
			}
			os.MkdirAll(filepath.Dir(target), 0o700)
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		}
	}
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
