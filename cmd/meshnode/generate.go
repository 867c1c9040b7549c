package main

// The CLI reference (docs/cli/) and docs/configuration.md are generated from the commands and
// the configuration keys by TestDocs_CLI and TestDocs_Configuration, which fail when the
// committed files drift; in a test, so that cobra/doc never links into the binary.
//go:generate go test -count=1 -run ^TestDocs_ -update-docs .
