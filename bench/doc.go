// Package bench measures what the mesh costs over raw NATS on the same embedded server:
// the performance figures of issue 4. Given a running node (its client URL, the operator's
// seed and a scratch directory: a Target), it returns structured results that `meshnode
// bench` prints and the package's Go benchmarks report.
//
// Three measurements, each with its raw baseline in the same run:
//
//   - Emit→On (EmitOn): N persistent events of 256 bytes, sdk Emit on module P → sdk On
//     handler on module C, against raw nats.go jetstream publish → durable pull consumer
//     Consume with explicit ack, on a throwaway stream BENCH_RAW_<run> (bench.raw.<run>.>,
//     which EVENTS' mesh.*.*.event.> does not overlap), deleted afterwards. Throughput is
//     events / (first send → last handler call); latency is handler call − send, read from a
//     stamp in the payload. Both sides first publish one event at a time and wait for the
//     stream's ack before the next (sdk.Emit is a synchronous JetStream publish), then
//     pipelined: sdk.EmitAsync + Flush against raw async publishes, up to 1,024 unanswered
//     on both sides, the raw side bare and with one more drained durable consumer (what an
//     audit log costs the broker). The raw stream is configured like EVENTS (file storage, duplicate window, age
//     and per-subject limits) and its consumer like a module's (explicit ack, MaxAckPending
//     and pull batch of manifest.MaxAckPending), each side on two connections (publisher,
//     consumer), so the difference is what the mesh adds: the envelope (UUIDv7, Ed25519
//     signature, headers, broker dedup on Nats-Msg-Id), nkey-derived permissions and the
//     sdk's dispatch. Targets (issue 20): synchronous ≥ 0.65 × raw; pipelined ≥ 0.8 × raw
//     with the drained consumer and ≥ 0.65 × bare.
//   - Tool call (ToolCall): request/reply round trips to a module's tool served with sdk
//     Serve, against a plain queue subscriber on a plain subject answering with Respond; the
//     caller of both is an operator connection using nc.Request, one call at a time,
//     alternating mesh and raw so drift weighs on both. The target is mesh p50 ≤ 1.1 × raw.
//   - Connect (Connect): register N generated modules (emitting, consuming, serving, one in
//     ten declaring a seat the next nine use), 8 at a time, connect them all, 8 at a time,
//     each starting its durable consumer, and keep them connected while timing sdk.Connect
//     of one more module named for it (one connection, whoami asked on it; target ≤ 1.3 ×
//     raw), sdk.Connect with the seed alone (a bootstrap connection, the whoami round trip,
//     the module's connection) and nats.Connect with the same module's nkey, each also with
//     only two modules registered (issue 37: growth ≤ 1.15×). With a Target.Node (the node
//     in a process of its own) it also reads the node's RSS with the modules registered and
//     with them connected, and restarts the node to time the registry mirror's catch-up and
//     the controller's reconcile of every module.
//
// Run the measurements against a throwaway node: they register modules and write to
// JetStream, and Connect leaves its modules registered. EmitOn and ToolCall remove theirs.
//
// The package's Go benchmarks start such a node in-process:
//
//	go test -run '^$' -bench . -benchtime 20000x ./bench/
package bench
