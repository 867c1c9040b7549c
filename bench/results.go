package bench

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// String returns the figures as the table WriteTo prints.
func (r Results) String() string {
	var b strings.Builder
	r.WriteTo(&b)
	return b.String()
}

// WriteTo prints the figures as a table: each measurement, the mesh, raw NATS, their ratio
// and issue 4's target where it has one.
func (r Results) WriteTo(w io.Writer) (int64, error) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "measurement (%d CPUs, GOMAXPROCS %d)\tmesh\traw NATS\tmesh/raw\ttarget\t\n", r.CPUs, r.GOMAXPROCS)
	if e := r.EmitOn; e != nil {
		fmt.Fprintf(tw, "emit→on, %d × %d B persistent\t\t\t\t\t\n", e.Events, e.PayloadBytes)
		fmt.Fprintf(tw, "  throughput\t%s\t%s\t%.2f×\t%s\t\n", perSecond(e.Mesh.PerSecond, "ev/s"), perSecond(e.Raw.PerSecond, "ev/s"),
			e.Ratio, verdict(e.Ratio >= TargetEmitOnRatio, fmt.Sprintf("≥ %.2f×", TargetEmitOnRatio)))
		fmt.Fprintf(tw, "  latency p50\t%s\t%s\t%.2f×\t\t\n", dur(e.Mesh.P50), dur(e.Raw.P50), ratio(float64(e.Mesh.P50), float64(e.Raw.P50)))
		fmt.Fprintf(tw, "  latency p99\t%s\t%s\t%.2f×\t%s\t\n", dur(e.Mesh.P99), dur(e.Raw.P99), e.P99Ratio,
			verdict(e.P99Ratio <= TargetP99Ratio, fmt.Sprintf("≤ %.1f×", TargetP99Ratio)))
		if e.Mesh.Duplicates+e.Raw.Duplicates > 0 {
			fmt.Fprintf(tw, "  redelivered\t%d\t%d\t\t\t\n", e.Mesh.Duplicates, e.Raw.Duplicates)
		}
		if e.Pipelined.Count > 0 {
			fmt.Fprintf(tw, "emit→on pipelined (EmitAsync), %d × %d B\t\t\t\t\t\n", e.Events, e.PayloadBytes)
			fmt.Fprintf(tw, "  vs raw async + a drained consumer\t%s\t%s\t%.2f×\t%s\t\n", perSecond(e.Pipelined.PerSecond, "ev/s"), perSecond(e.RawAsyncAudited.PerSecond, "ev/s"),
				e.PipelinedAuditedRatio, verdict(e.PipelinedAuditedRatio >= TargetPipelinedAuditedRatio, fmt.Sprintf("≥ %.2f×", TargetPipelinedAuditedRatio)))
			fmt.Fprintf(tw, "  vs bare raw async\t%s\t%s\t%.2f×\t%s\t\n", perSecond(e.Pipelined.PerSecond, "ev/s"), perSecond(e.RawAsync.PerSecond, "ev/s"),
				e.PipelinedRatio, verdict(e.PipelinedRatio >= TargetPipelinedRatio, fmt.Sprintf("≥ %.2f×", TargetPipelinedRatio)))
			fmt.Fprintf(tw, "  latency p50\t%s\t%s\t%.2f×\t\t\n", dur(e.Pipelined.P50), dur(e.RawAsync.P50), ratio(float64(e.Pipelined.P50), float64(e.RawAsync.P50)))
		}
		if e.RawSigned.Count > 0 {
			fmt.Fprintf(tw, "emit→on against the signed floor (raw signing and verifying twice, by hand)\t\t\t\t\t\n")
			// Three decimals: 0.849 printed 0.85 beside "≥ 0.85× MISSED".
			fmt.Fprintf(tw, "  one at a time\t%s\t%s\t%.3f×\t%s\t\n", perSecond(e.Mesh.PerSecond, "ev/s"), perSecond(e.RawSigned.PerSecond, "ev/s"),
				e.SignedFloorRatio, verdict(e.SignedFloorRatio >= TargetSignedFloorRatio, fmt.Sprintf("≥ %.2f×", TargetSignedFloorRatio)))
			fmt.Fprintf(tw, "  one at a time, latency p99\t%s\t%s\t%.2f×\t\t\n", dur(e.Mesh.P99), dur(e.RawSigned.P99), ratio(float64(e.Mesh.P99), float64(e.RawSigned.P99)))
			fmt.Fprintf(tw, "  pipelined\t%s\t%s\t%.3f×\t%s\t\n", perSecond(e.Pipelined.PerSecond, "ev/s"), perSecond(e.RawAsyncSigned.PerSecond, "ev/s"),
				e.PipelinedSignedFloorRatio, verdict(e.PipelinedSignedFloorRatio >= TargetPipelinedSignedFloorRatio, fmt.Sprintf("≥ %.2f×", TargetPipelinedSignedFloorRatio)))
			if e.Rounds > 1 {
				fmt.Fprintf(tw, "  each of %d rounds, one at a time\t\t\t%s\t\t\n", e.Rounds, ratios(e.SignedFloorRatios))
				fmt.Fprintf(tw, "  each of %d rounds, pipelined\t\t\t%s\t\t\n", e.Rounds, ratios(e.PipelinedSignedFloorRatios))
				fmt.Fprintf(tw, "  each of %d rounds, p99 against bare raw's\t\t\t%s\t\t\n", e.Rounds, ratios(e.P99Ratios))
			}
		}
	}
	if c := r.ToolCall; c != nil {
		fmt.Fprintf(tw, "tool call round trip, %d × %d B\t\t\t\t\t\n", c.Calls, c.PayloadBytes)
		fmt.Fprintf(tw, "  latency p50\t%s\t%s\t%.2f×\t%s\t\n", dur(c.Mesh.P50), dur(c.Raw.P50), c.Ratio,
			verdict(c.Ratio <= TargetToolCallRatio, fmt.Sprintf("≤ %.1f×", TargetToolCallRatio)))
		fmt.Fprintf(tw, "  latency p99\t%s\t%s\t%.2f×\t\t\n", dur(c.Mesh.P99), dur(c.Raw.P99), c.RatioP99)
		fmt.Fprintf(tw, "  calls/s, one at a time\t%s\t%s\t%.2f×\t\t\n", perSecond(c.Mesh.PerSecond, "/s"), perSecond(c.Raw.PerSecond, "/s"),
			ratio(c.Mesh.PerSecond, c.Raw.PerSecond))
	}
	if c := r.Connect; c != nil {
		fmt.Fprintf(tw, "connect, %d modules registered\t\t\t\t\t\n", c.Modules)
		fmt.Fprintf(tw, "  p50 (sdk.Connect as the module vs nats.Connect)\t%s\t%s\t%.2f×\t%s\t\n", dur(c.SDK.P50), dur(c.Raw.P50), c.Ratio,
			verdict(c.Ratio <= TargetConnectRatio, fmt.Sprintf("≤ %.1f×", TargetConnectRatio)))
		fmt.Fprintf(tw, "  p50, seed alone (a whoami connection first)\t%s\t%s\t%.2f×\t\t\n", dur(c.SDKUnnamed.P50), dur(c.Raw.P50), c.RatioUnnamed)
		fmt.Fprintf(tw, "  p50, floor: nats.Connect, then whoami with nats.go\t%s\t%s\t%.2f×\t\t\n", dur(c.RawAsk.P50), dur(c.Raw.P50), c.Floor)
		fmt.Fprintf(tw, "  p99\t%s\t%s\t%.2f×\t\t\n", dur(c.SDK.P99), dur(c.Raw.P99), ratio(float64(c.SDK.P99), float64(c.Raw.P99)))
		fmt.Fprintf(tw, "  p50 with 2 modules registered\t%s\t%s\t%.2f×\t\t\n", dur(c.SDKFew.P50), dur(c.RawFew.P50),
			ratio(float64(c.SDKFew.P50), float64(c.RawFew.P50)))
		fmt.Fprintf(tw, "  p50 growth, %d vs 2 modules\t%.2f×\t%.2f×\t\t%s\t\n", c.Modules, c.Growth, ratio(float64(c.Raw.P50), float64(c.RawFew.P50)),
			verdict(c.Growth <= TargetConnectGrowth, fmt.Sprintf("≤ %.2f×", TargetConnectGrowth)))
		fmt.Fprintf(tw, "  registration, %d at a time (%d seats)\t%s (%s each, %s)\t\t\t\t\n", c.Workers, c.Seats,
			c.Register.Round(time.Millisecond), dur(c.PerRegister), perSecond(c.RegisterPerSecond, "/s"))
		fmt.Fprintf(tw, "  registration round trip p50, p99, slowest\t%s, %s, %s\t\t\t\t\n", dur(c.Registrations.P50), dur(c.Registrations.P99), dur(c.Registrations.Max))
		fmt.Fprintf(tw, "  connect all, %d at a time, each with its consumer\t%d in %s\t\t\t\t\n", c.Workers, c.Connected, c.ConnectAll.Round(time.Millisecond))
		if !c.Node {
			fmt.Fprintln(tw, "  node RSS, restart\tnot measured: the node shares this process (meshnode bench --node-process)\t\t\t\t")
		} else {
			fmt.Fprintf(tw, "  node RSS, registered / all connected\t%s / %s\t\t\t\t\n", mib(c.RSSIdle), mib(c.RSSConnected))
			fmt.Fprintf(tw, "  node RSS per 1,000 connected modules\t%s\t\t\t\t\n", mib(c.RSSPer1000))
		}
		if r := c.Restart; r != nil {
			fmt.Fprintf(tw, "  restart: stop, then ready\t%s, %s\t\t\t\t\n", dur(r.Stop), dur(r.Ready))
			fmt.Fprintf(tw, "  restart: registry mirror caught up (%d modules listed)\t%s after the node's open\t\t\t\t\n", r.Modules, dur(r.Registry))
			fmt.Fprintf(tw, "  restart: controller's reconcile of every module\t%s\t\t\t\t\n", dur(r.Reconcile))
		}
		fmt.Fprintln(tw, "connect: one node; the modules connect over loopback from the bench's process.")
	}
	if e := r.EmitOn; e != nil {
		fmt.Fprintln(tw, "emit→on: both sides publish one event at a time and wait for the stream's ack (as sdk.Emit does);")
		fmt.Fprintln(tw, "pipelined: both sides keep up to 1,024 unanswered (sdk.EmitAsync, then Flush).")
		if e.Rounds > 1 {
			fmt.Fprintf(tw, "The mesh and the signed floor ran %d rounds each way: every figure is the median of the rounds', every ratio\n", e.Rounds)
			fmt.Fprintln(tw, "with the floor the median of the rounds' ratios (each round's two sides back to back).")
		}
	}
	tw.Flush()
	var out bytes.Buffer // the table without the padding tabwriter leaves at line ends
	for line := range strings.Lines(buf.String()) {
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	n, err := w.Write(out.Bytes())
	return int64(n), err
}

// verdict is the target, marked when the figure misses it.
func verdict(met bool, target string) string {
	if met {
		return target + " ok"
	}
	return target + " MISSED"
}

// dur prints d with three significant figures in a unit that suits it.
func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

// mib prints a number of bytes in MiB.
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// perSecond prints a rate without decimals, with thousands separated.
func perSecond(v float64, unit string) string {
	s := fmt.Sprintf("%.0f", v)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String() + " " + unit
}

// ratios prints each round's ratio, in the order run.
func ratios(rs []float64) string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("%.3f", r)
	}
	return strings.Join(out, " ")
}
