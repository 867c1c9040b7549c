package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
)

// jsonKeys are the keys a verb's --json help documents: the comma-separated words after
// its last colon, a trailing "?" marking one a record may leave out.
func jsonKeys(path string) (required, optional []string, err error) {
	c := leaves(newRootCmd())[path]
	if c == nil {
		return nil, nil, fmt.Errorf("no verb %q", path)
	}
	f := c.Flags().Lookup("json")
	if f == nil {
		return nil, nil, fmt.Errorf("meshnode %s has no --json", path)
	}
	i := strings.LastIndex(f.Usage, ":")
	if i < 0 {
		return nil, nil, fmt.Errorf("meshnode %s's --json help %q names no keys (…: key, key, optional?)", path, f.Usage)
	}
	for k := range strings.SplitSeq(f.Usage[i+1:], ",") {
		k = strings.TrimSpace(k)
		if opt, ok := strings.CutSuffix(k, "?"); ok {
			optional = append(optional, opt)
		} else if k != "" {
			required = append(required, k)
		}
	}
	return required, optional, nil
}

// checkJSON decodes out (a stream of JSON objects, one per record) and checks every record
// has the keys path's --json help documents and no key it does not; it returns the records.
func checkJSON(t *testing.T, path, out string) []map[string]json.RawMessage {
	t.Helper()
	required, optional, err := jsonKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	var records []map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var rec map[string]json.RawMessage
		if err := dec.Decode(&rec); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("meshnode %s --json: not JSON objects (%v):\n%s", path, err, out)
		}
		records = append(records, rec)
		for _, k := range required {
			if v, ok := rec[k]; !ok {
				t.Errorf("meshnode %s --json: a record has no %q, which its help documents: %s", path, k, compact(rec))
			} else if string(v) == "null" {
				t.Errorf("meshnode %s --json: a record's %q is null (an empty list is [], an absent value is left out with ? in the help): %s", path, k, compact(rec))
			}
		}
		for k := range rec {
			if !slices.Contains(required, k) && !slices.Contains(optional, k) {
				t.Errorf("meshnode %s --json: a record has %q, which its help does not document (add it, with ? if it may be left out): %s", path, k, compact(rec))
			}
		}
	}
	return records
}

func compact(rec map[string]json.RawMessage) string {
	b, _ := json.Marshal(rec)
	return string(b)
}
