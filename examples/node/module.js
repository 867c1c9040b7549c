// A meshnode module in Node.js, with the plain `nats` and `nkeys.js` packages: it learns who
// it is from whoami, serves its declared tools, consumes its durable consumer on EVENTS
// (checking every envelope as the Go sdk does) and emits signed events.
//
//   MESHNODE_URL=nats://127.0.0.1:4222 MESHNODE_SEED=notes.nk node module.js
//   MESHNODE_URL=tls://10.0.0.2:4222 MESHNODE_SEED=notes.nk MESHNODE_CA=ca.pem node module.js
//
// Deployed, it reads what its node gives every module: MESH_URL and MESH_CREDS, and MESH_CA
// when the node's client port is TLS (off loopback it always is). `npm run
// bundle` makes it one file, dist/module.js, that `meshnode artifact put` stores as is.
//
// What it does with an event, to show the delivery contract: a body with "fail": true is
// NAKed every time, so after 5 deliveries the node dead-letters it; any other is acked and
// answered with the module's first declared event, caused by it. An event that fails the
// envelope checks is terminated with the reason, which becomes its x-dead-reason.
"use strict";

const fs = require("node:fs");
const { connect, headers, nkeyAuthenticator, AckPolicy } = require("nats");
const nkeys = require("nkeys.js");
const env = require("./envelope");

const url = process.env.MESH_URL || process.env.MESHNODE_URL || "nats://127.0.0.1:4222";
const seed = fs.readFileSync(process.env.MESH_CREDS || process.env.MESHNODE_SEED || "module.nk", "utf8").trim();
// The mesh's CA certificate (ca.pem in any node's data dir): a TLS client port's certificate
// is issued by it, not by a public CA, so it is the only one trusted.
const caFile = process.env.MESH_CA || process.env.MESHNODE_CA || "";
const kp = nkeys.fromSeed(Buffer.from(seed));
const pub = kp.getPublicKey();
const REPLAY_WINDOW_MS = 10 * 60 * 1000;

const log = (...a) => console.log(new Date().toISOString(), ...a);

// Back-offs: between attempts to reach the controller or to find the consumer, doubling from
// the first wait to the last (what the Go sdk's internal/jsconsume waits).
const RETRY_FIRST_MS = 200;
const RETRY_MAX_MS = 5000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// How long an emit is tried again through a fault, less than the ack wait of a module's
// consumer (30 s): an event whose answer cannot be emitted is NAKed, and one NAKed five
// times is dead-lettered, so a handler that gave up at the first timeout of a node's restart
// would lose the events of the whole outage.
const EMIT_PATIENCE_MS = 20000;
// How many events are handled at once: as many as the consumer lets wait for their acks
// (its MaxAckPending, 32), since each handler waits on its answer's ack. At 16 the module
// could not work off what a 30-minute fault run left it behind.
const HANDLERS = 32;
// The nats.js error codes of a publish that found no stream to ack it yet: a timeout, no
// responders (the stream or the admitter not up yet), the connection dropped.
const TRANSIENT = new Set(["TIMEOUT", "503", "DISCONNECT", "CONNECTION_REFUSED"]);

// Connections reconnect for ever (a node restarting refuses them until it has read its
// registry, hence ignoreAuthErrorAbort), to this node only: in a cluster the server
// advertises the others, and a module talks to its own node, as the Go sdk does. A node not
// up yet at start is waited for, not a failure.
const connectOptions = {
  maxReconnectAttempts: -1,
  reconnectTimeWait: 250,
  waitOnFirstConnect: true,
  ignoreAuthErrorAbort: true,
  ignoreClusterUpdates: true,
};

// whoami asks the mesh's controller which module this key is, on a connection whose inbox
// is named for the key (the only inbox a client that does not know its name may use).
async function whoami(nc) {
  const m = await nc.request(`mesh.seat.mesh-controller.tool.whoami.${pub}`,
    JSON.stringify({ public_key: pub }), { timeout: 10000 });
  const reply = JSON.parse(Buffer.from(m.data).toString("utf8"));
  if (reply.error) throw new Error(`whoami: ${reply.error}`);
  return reply;
}

// firstWhoami asks whoami until the controller answers: at start the node may be restarting
// or the controller's seat changing hands. An answer that refuses the key is final, and so
// are two refusals of the connection in a row (the key is not registered): the module exits
// saying so, rather than waiting for ever unseen.
async function firstWhoami(auth) {
  const boot = await connect({ ...auth, ...connectOptions, ignoreAuthErrorAbort: false,
    inboxPrefix: `_INBOX.${pub}`, name: "whoami" });
  try {
    for (let wait = RETRY_FIRST_MS; ; wait = Math.min(wait * 2, RETRY_MAX_MS)) {
      try {
        return await whoami(boot);
      } catch (err) {
        if (err.message.startsWith("whoami:")) throw err;
        log("whoami does not answer yet:", err.message);
        await sleep(wait);
      }
    }
  } finally {
    await boot.close();
  }
}

async function main() {
  const auth = { authenticator: nkeyAuthenticator(Buffer.from(seed)), servers: url };
  if (caFile) auth.tls = { caFile };
  let self = await firstWhoami(auth);
  const module = self.module;

  const nc = await connect({ ...auth, ...connectOptions, inboxPrefix: `_INBOX.${module}`,
    name: `${module}-node-${process.pid}` });
  nc.closed().then((err) => err && log("connection closed:", err.message));
  let stopping = false;
  const js = nc.jetstream();
  const stats = { handled: 0, failed: 0, refused: 0, emitted: 0 };

  // After a reconnect the declarations may have changed while it was away (a redeploy, a
  // key rotated): ask whoami again, keeping the last answer if there is none.
  (async () => {
    for await (const s of nc.status()) {
      if (s.type === "disconnect") log("disconnected from", s.data);
      if (s.type !== "reconnect") continue;
      log("reconnected to", s.data);
      self = await whoami(nc).catch((err) => {
        log("whoami after reconnect; keeping the last declarations:", err.message);
        return self;
      });
    }
  })();

  // Tools: core request/reply, queue group = the module.
  for (const tool of self.tools || []) {
    nc.subscribe(`mesh.mod.${module}.tool.${tool}`, {
      queue: module,
      callback: (err, m) => {
        if (!err) m.respond(JSON.stringify({ module, tool, ...stats }));
      },
    });
  }

  // emit publishes one of the module's declared events and waits for the stream's ack. It
  // signs the event's subject and publishes it under the module's prefix, mesh.admit.<module>,
  // where the node's admitter takes it (docs/contracts.md). What may pass in a moment is sent
  // again, the same event (its id dedups it in the stream), after a back-off, for up to
  // EMIT_PATIENCE_MS: a refusal the admitter calls retryable (err_code 19002, the mesh's audit
  // log behind; 19003, past the module's pace), and the silences of a node restarting or of
  // a stream electing its leader (no ack in time, no responders, the connection dropped).
  // Any other refusal (19001, over the module's quota of EVENTS) is thrown at once. working,
  // if given, is called before each retry: the handler's event is still being worked on.
  async function emit(event, payload, causation, working) {
    const subject = `mesh.mod.${module}.event.${event}`;
    const body = Buffer.from(JSON.stringify(payload), "utf8");
    const h = headers();
    const id = env.stamp(h, kp, { source: module, node: self.node, subject, body, causation });
    // The lines tell a watcher (a test's history) when a publish began and how it ended:
    // "emitted" only once the stream acked it; "emit-failed" when it gave up.
    log("emitting", event, id);
    const giveUp = Date.now() + EMIT_PATIENCE_MS;
    for (let attempt = 0; ; attempt++) {
      try {
        await js.publish(`mesh.admit.${module}.${subject}`, body, { headers: h, msgID: id });
        break;
      } catch (err) {
        const code = err && err.api_error && err.api_error.err_code;
        const passing = code === 19002 || code === 19003 || (!code && TRANSIENT.has(err && err.code));
        if (!passing || stopping || Date.now() >= giveUp) {
          log("emit-failed", event, id, err.message);
          throw err;
        }
        if (working) working();
        const wait = Math.min(250, 2 << Math.min(attempt, 7));
        await sleep(wait / 2 + Math.random() * (wait / 2));
      }
    }
    stats.emitted++;
    log("emitted", event, id);
    return id;
  }

  // handle takes one event: checks its envelope, answers it with the module's first event,
  // and acks it last; a failure NAKs it, so it comes again.
  async function handle(m) {
    const subject = env.originalSubject(m.subject);
    const replay = subject !== m.subject;
    const stored = m.info.timestampNanos / 1e6;
    let why = env.check(subject, m.headers, m.data, self.signers || {}, stored, REPLAY_WINDOW_MS, replay);
    if (why.startsWith("no registered key") || why.startsWith("x-signature")) {
      self = await whoami(nc).catch(() => self); // keys change: ask once more
      why = env.check(subject, m.headers, m.data, self.signers || {}, stored, REPLAY_WINDOW_MS, replay);
    }
    if (why) {
      stats.refused++;
      log("refused", subject, why);
      m.term(`refused by the envelope checks: ${why}`);
      return;
    }
    const id = m.headers.get(env.H.id);
    let body = {};
    try { body = JSON.parse(Buffer.from(m.data).toString("utf8")); } catch { /* not JSON: handled as {} */ }
    if (body.fail) {
      stats.failed++;
      log("failed", subject, id, "delivery", m.info.deliveryCount);
      m.nak(10);
      return;
    }
    try {
      if ((self.emits || []).length > 0) await emit(self.emits[0], { handled: id }, id, () => m.working());
      m.ack();
      stats.handled++;
      log("handled", subject, id);
    } catch (err) {
      log("handler failed:", err.message);
      m.nak(1000);
    }
  }

  // consume consumes the module's durable consumer on EVENTS until the module stops, and
  // starts over whenever a consumption ends or cannot go on by itself — what the Go sdk's
  // internal/jsconsume does. nats.js's consume() keeps its iterator open when the consumer
  // is deleted (drift repair makes it again) or cannot be found, and only reports it on its
  // status; heartbeats missed mean the pull it waits on is lost (its node restarted, the
  // consumer's leader moved). A fresh consumer and pull then is what gets events again.
  async function consume() {
    const restartOn = new Set(["consumer_deleted", "consumer_not_found", "stream_not_found",
      "no_responders", "heartbeats_missed"]);
    // Every other status is logged, but for those that come with each pull.
    const quietStatus = new Set(["next", "heartbeat", "debug"]);
    let wait = RETRY_FIRST_MS;
    while (!stopping) {
      let messages;
      try {
        const consumer = await js.consumers.get("EVENTS", module);
        // A lost pull is noticed after two missed heartbeats. nats.js's default heartbeat is
        // half of expires (5 s), and a pull that expires sends the next one, which starts the
        // count again: a consumer whose leader was killed was noticed only 20 s later. At
        // 2 s, it is within 4–14 s.
        messages = await consumer.consume({ max_messages: 32, expires: 10000, idle_heartbeat: 2000 });
      } catch (err) {
        if (stopping) return;
        log(`consumer EVENTS/${module} does not answer yet:`, err.message);
        await sleep(wait);
        wait = Math.min(wait * 2, RETRY_MAX_MS);
        continue;
      }
      wait = RETRY_FIRST_MS;
      let why = "";
      (async () => {
        for await (const s of await messages.status()) {
          if (!quietStatus.has(s.type)) log(`consumer EVENTS/${module} status ${s.type} ${s.data ?? ""}`);
          if (restartOn.has(s.type) && !why) {
            why = `${s.type} ${s.data}`;
            messages.stop();
          }
        }
      })().catch(() => { /* the status iterator ends with the consumption */ });
      // Up to HANDLERS events at once: each waits for its answer's ack, and one at a time
      // falls behind a busy emitter (the consumer's ack wait runs for each event pulled).
      const inFlight = new Set();
      try {
        for await (const m of messages) {
          const p = handle(m).catch((err) => log("handler failed:", err.message)).finally(() => inFlight.delete(p));
          inFlight.add(p);
          if (inFlight.size >= HANDLERS) await Promise.race(inFlight);
        }
      } catch (err) {
        why = why || err.message;
      }
      await Promise.all(inFlight);
      if (stopping) return;
      log(`consumption of EVENTS/${module} ended (${why || "closed"}); consuming it again`);
      await sleep(wait);
    }
  }
  if ((self.consumes || []).length > 0) consume();
  log("ready", module);

  const stop = async () => { stopping = true; await nc.drain(); process.exit(0); };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => { console.error("module failed:", err.message); process.exit(1); });
