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
	files := sources(t, func(path string) bool { return !strings.HasSuffix(path, "_test.go") })
	if len(files) < 50 {
		t.Fatalf("read %d Go files: the walk missed the repository", len(files))
	}
	for rel, src := range files {
		for i, line := range strings.Split(src, "\n") {
			if errorText.MatchString(line) {
				t.Errorf("%s:%d tells an error apart by its text: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// skipCall matches a test skipping itself other than through testbed.Skip.
var skipCall = regexp.MustCompile(`\w\.Skip(f|Now)?\(`)

// TestSkipsSayWhyAndFailInCI: every skip goes through testbed.Skip, which fails the test
// where CI says every bed must run, so a bed that cannot run there is a red run, not a
// silent green one.
func TestSkipsSayWhyAndFailInCI(t *testing.T) {
	tests := sources(t, func(path string) bool { return strings.HasSuffix(path, "_test.go") })
	if len(tests) < 30 {
		t.Fatalf("read %d test files: the walk missed the repository", len(tests))
	}
	for rel, src := range tests {
		for i, line := range strings.Split(src, "\n") {
			if skipCall.MatchString(line) && !strings.Contains(line, "testbed.Skip(") {
				t.Errorf("%s:%d skips other than through testbed.Skip: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// testFunc matches a test function's declaration and captures its name.
var testFunc = regexp.MustCompile(`(?m)^func (Test\w*)\(`)

// TestIntegrationTierIsNamed: the beds behind the integration build tag are exactly the
// tests named TestIntegration_*, the pattern CI's integration step runs, so none is
// built there and never run, and none of the fast tier runs twice.
func TestIntegrationTierIsNamed(t *testing.T) {
	tagged := 0
	for rel, src := range sources(t, func(path string) bool { return strings.HasSuffix(path, "_test.go") }) {
		integration := strings.HasPrefix(src, "//go:build integration\n")
		for _, m := range testFunc.FindAllStringSubmatch(src, -1) {
			named := strings.HasPrefix(m[1], "TestIntegration_")
			switch {
			case integration && !named:
				t.Errorf("%s: %s is behind the integration tag but not named TestIntegration_*: CI would never run it", rel, m[1])
			case !integration && named:
				t.Errorf("%s: %s is named TestIntegration_* but not behind the integration tag: CI would run it twice", rel, m[1])
			case integration:
				tagged++
			}
		}
	}
	if tagged == 0 {
		t.Fatal("found no integration beds: the walk missed them")
	}
}

// sources returns the repository's Go files that keep says to, by path from the root.
func sources(t *testing.T, keep func(path string) bool) map[string]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || !keep(path) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files[rel] = string(src)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
