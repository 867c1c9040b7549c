package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// pythonExample returns a Python 3 that imports PyNaCl — Debian's python3-nacl goes with
// Debian's /usr/bin/python3, which another python3 earlier in PATH (pyenv) may not see — and
// examples/python-module's directory; the test is skipped only where there is none.
func pythonExample(t *testing.T) (python, dir string) {
	t.Helper()
	dir, err := filepath.Abs("../../examples/python-module")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import nacl.signing").Run() == nil {
			return p, dir
		}
	}
	testbed.Skip(t, "no python3 with PyNaCl: the Python example needs Python 3.10 or later and Debian's python3-nacl (apt-get install python3-nacl)")
	return "", ""
}

// TestPythonExample_Vectors: the Python envelope and nkey code agrees with the Go code's
// test vectors (signing input, public key from the seed, signature, verification) and
// gives each of the signature rule's edge cases the Go code's verdict.
func TestPythonExample_Vectors(t *testing.T) {
	python, dir := pythonExample(t)
	cmd := exec.Command(python, "vectors.py", "../../envelope/testdata/vectors.json")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "4 of 4 vectors ok") || !strings.Contains(string(out), edgeAgree(t)) {
		t.Fatalf("python3 vectors.py: %v\n%s", err, out)
	}
}

// edgeAgree is what the examples' vectors print when every one of the signature rule's edge
// cases (envelope/testdata/ed25519-edge.json) got the Go code's verdict.
func edgeAgree(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../envelope/testdata/ed25519-edge.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []json.RawMessage
	if err := json.Unmarshal(b, &vs); err != nil || len(vs) == 0 {
		t.Fatalf("the edge cases: %v (%d)", err, len(vs))
	}
	return fmt.Sprintf("%d of %d edge cases agree with the rule", len(vs), len(vs))
}
