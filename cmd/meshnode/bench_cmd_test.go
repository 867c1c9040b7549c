package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/bench"
)

// TestBenchCmd runs `meshnode bench` with tiny counts: it starts its own node, prints every
// measurement, and leaves nothing in the temporary directory.
func TestBenchCmd(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where the throwaway node's data dir goes

	t.Run("JSON", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		cmd := newBenchCmd()
		cmd.SetArgs([]string{"--events", "50", "--calls", "20", "--modules", "4", "--json"})
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		if err := cmd.Execute(); err != nil {
			t.Fatalf("bench: %v\n%s", err, stderr.String())
		}
		var res bench.Results
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			t.Fatalf("output is not the results as JSON: %v\n%s", err, stdout.String())
		}
		if res.EmitOn == nil || res.ToolCall == nil || res.Connect == nil {
			t.Fatalf("a measurement is missing: %s", stdout.String())
		}
		if res.EmitOn.Mesh.Count != 50 || res.EmitOn.Raw.Count != 50 || !(res.EmitOn.Ratio > 0) {
			t.Errorf("emit→on: %+v", *res.EmitOn)
		}
		if e := res.EmitOn; e.RawSigned.Count != 50 || e.RawAsyncSigned.Count != 50 || !(e.SignedFloorRatio > 0) || !(e.PipelinedSignedFloorRatio > 0) {
			t.Errorf("emit→on against the signed floor: raw_signed %d, raw_async_signed %d, ratios %v %v; want 50 each and ratios",
				e.RawSigned.Count, e.RawAsyncSigned.Count, e.SignedFloorRatio, e.PipelinedSignedFloorRatio)
		}
		if res.ToolCall.Mesh.Count != 20 || res.ToolCall.Raw.Count != 20 || !(res.ToolCall.Ratio > 0) {
			t.Errorf("tool call: %+v", *res.ToolCall)
		}
		if res.Connect.Modules != 4 || res.Connect.SDK.Count == 0 || !(res.Connect.Ratio > 0) {
			t.Errorf("connect: %+v", *res.Connect)
		}
	})

	t.Run("Table", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		cmd := newBenchCmd()
		cmd.SetArgs([]string{"--events", "20", "--calls", "10", "--modules", "0"})
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		if err := cmd.Execute(); err != nil {
			t.Fatalf("bench: %v\n%s", err, stderr.String())
		}
		out := stdout.String()
		for _, want := range []string{"emit→on, 20 × 256 B", "throughput", "tool call round trip, 10 × 256 B", "mesh/raw"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "connect,") {
			t.Errorf("--modules 0 measured connects anyway:\n%s", out)
		}
	})

	if entries, err := os.ReadDir(tmp); err != nil || len(entries) != 0 {
		t.Errorf("bench left %d entries in the temporary directory (%v)", len(entries), err)
	}
}

func TestBenchCmd_UsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--events", "-1"},
		{"--cpus", "-1"},
		{"--rounds", "0"},
		{"--rounds", "21"},
		{"--modules", "1"},
		{"--events", "0", "--calls", "0", "--modules", "0"},
		{"extra"},
	} {
		cmd := newBenchCmd()
		cmd.SetArgs(args)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.Execute()
		if got, want := exitCode(err, &bytes.Buffer{}), exitUsage; got != want {
			t.Errorf("bench %v: exit %d (%v), want %d", args, got, err, want)
		}
	}
}
