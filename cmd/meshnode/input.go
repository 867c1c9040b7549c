package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/meshnode/meshnode/manifest"
)

// Every file a verb reads is read with a bound before it is parsed: a path to /dev/zero, a
// FIFO or a log file given by mistake is refused after its limit, not read into memory
// (`module check /dev/zero` grew to 1.2 GB in 6 s).

// maxConfigBytes bounds meshnode.yaml: a configuration is a few dozen keys.
const maxConfigBytes = 1 << 20

// maxTokenBytes bounds a token file: a founding token with its gossip addresses is well
// under a kilobyte.
const maxTokenBytes = 64 << 10

// errTooLarge is wrapped by readBounded's refusal of a file over its limit.
var errTooLarge = errors.New("too large")

// readBounded reads path, refusing it once it holds more than limit bytes; what names the
// file for the refusal ("manifest", "configuration").
func readBounded(path, what string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is %w for a %s: it holds more than %d bytes", path, errTooLarge, what, limit)
	}
	return b, nil
}

// readManifest reads a manifest file with the bound manifest.MaxSize. A larger one is the
// size refusal every other manifest over the limit gets, with its size when it is a regular
// file and "more than" the limit when it is endless (/dev/zero) or a stream.
func readManifest(path string) ([]byte, error) {
	b, err := readBounded(path, "manifest", manifest.MaxSize)
	if !errors.Is(err, errTooLarge) {
		return b, err
	}
	if st, serr := os.Stat(path); serr == nil && st.Mode().IsRegular() && st.Size() > manifest.MaxSize {
		return nil, manifest.CheckSize(int(st.Size()))
	}
	var rs manifest.Refusals
	errors.As(manifest.CheckSize(manifest.MaxSize+1), &rs)
	rs[0].Value = "more than " + strconv.Itoa(manifest.MaxSize) + " bytes"
	return nil, rs
}

// maxSeedBytes bounds a seed file (--creds): a seed is 58 characters; nats.go and the sdk
// read the whole file, so it is bounded here, before either does.
const maxSeedBytes = 16 << 10

// checkSeedFile refuses a seed file that is not one: larger than any seed file (or endless,
// /dev/zero), before nats.go reads it whole. A file that cannot be opened is left to the
// reader, whose message names the seed.
func checkSeedFile(path string) error {
	if _, err := readBounded(path, "seed file", maxSeedBytes); errors.Is(err, errTooLarge) {
		return usagef("--creds %s: %v; pass the seed file `meshnode module register --creds-out` wrote, or the operator's (operator.nk in the data dir)", path, err)
	}
	return nil
}
