// Package codehealth holds tests that read the repository's own source for habits the
// project has given up (issue 13).
package codehealth

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// errorText matches an error told apart by its message: a comparison of err.Error() (or
// of a variable's .Error()) with strings.Contains, HasPrefix, HasSuffix, ==, or a switch on it.
var errorText = regexp.MustCompile(`strings\.(Contains|HasPrefix|HasSuffix|EqualFold)\([^()]*\.Error\(\)|\.Error\(\) *(==|!=) *"`)

// TestNoErrorsToldApartByText: control flow never reads an error's message; errors are told
// apart by type and code (errors.Is/As, jetstream.APIError.ErrorCode). Tests may read
// messages: they check what a person is told.
func TestNoErrorsToldApartByText(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if errorText.MatchString(line) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d tells an error apart by its text: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read %d Go files: the walk missed the repository", files)
	}
}
