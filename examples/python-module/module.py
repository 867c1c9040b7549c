"""A meshnode module in Python: the standard library and PyNaCl (Debian's python3-nacl),
no NATS client library. It follows docs/guide/module-without-sdk.md step by step: it asks
whoami who its seed is, serves its declared tools, pulls its durable consumer on EVENTS
(checking every envelope as the Go sdk does) and emits signed events through the node's
admitter.

    MESHNODE_URL=nats://127.0.0.1:4222 MESHNODE_SEED=notes.nk python3 module.py

Deployed, it reads what its node gives every module: MESH_URL and MESH_CREDS (and MESH_CA
when the node's client port is TLS).

What it does with an event: one that fails the envelope checks is terminated with the
reason (the node dead-letters it with that reason); any other is answered with the module's
first declared event, caused by it, and acked."""

import datetime
import json
import os
import queue
import random
import signal
import sys
import threading
import time

import bus
import envelope
import nkey

REPLAY_WINDOW = 10 * 60  # seconds, as the Go sdk's default
PULL_BATCH, PULL_EXPIRES = 16, 5.0  # messages, seconds
RETRYABLE = (19002, 19003)  # the admitter's "audit log behind" and "past the module's pace"


def log(*a):
    print(datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"), *a, flush=True)


def whoami(nc: bus.Conn, pub: str) -> dict:
    """Asks the mesh's controller which module the key pub is: on
    mesh.seat.mesh-controller.tool.whoami.<key>, body {"public_key": key}."""
    m = nc.request(f"mesh.seat.mesh-controller.tool.whoami.{pub}", json.dumps({"public_key": pub}).encode())
    reply = json.loads(m.data)
    if reply.get("error"):
        raise bus.BusError("whoami: " + reply["error"])
    return reply


def stored_at(reply: str) -> float:
    """When the stream stored a delivered message (seconds since the epoch), from its ack
    subject: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>, or with
    <domain>.<account hash> after $JS.ACK and a random token at the end."""
    t = reply.split(".")
    return int(t[7 if len(t) == 9 else 9]) / 1e9


class Module:
    def __init__(self, url: str, kp: nkey.KeyPair, ca: str):
        self.kp = kp
        # The key's own inbox: before whoami, the client does not know its name.
        boot = bus.Conn(url, kp, f"_INBOX.{kp.public_key}", "whoami", ca)
        self.self = whoami(boot, kp.public_key)
        boot.close()
        self.name = self.self["module"]
        self.nc = bus.Conn(url, kp, f"_INBOX.{self.name}", f"{self.name}-python-{os.getpid()}", ca)
        # x-node: the server this connection reached (INFO's server_name), else whoami's node.
        self.node = self.nc.info.get("server_name") or self.self.get("node", "")
        self.stats = {"handled": 0, "refused": 0, "emitted": 0}
        self.calls = queue.Queue()

    def serve_tools(self):
        """Answers each declared tool on mesh.mod.<module>.tool.<tool>, queue group <module>."""
        for tool in self.self.get("tools", []):
            def answer(m, tool=tool):
                if m.reply:
                    self.nc.publish(m.reply, json.dumps({"module": self.name, "tool": tool, **self.stats}).encode())
            self.nc.subscribe(f"mesh.mod.{self.name}.tool.{tool}", answer, self.name)

    def emit(self, event: str, payload: dict, causation: str = "") -> str:
        """Publishes one of the module's events and waits for the stream's ack. It signs the
        event's subject and publishes under the module's prefix, mesh.admit.<module>.<subject>;
        a retryable refusal or a lost answer is sent again, same id, after a back-off."""
        subject = f"mesh.mod.{self.name}.event.{event}"
        body = json.dumps(payload).encode()
        h = envelope.stamp(self.kp, self.name, self.node, subject, body, causation)
        for attempt in range(50):
            try:
                ack = json.loads(self.nc.request(f"mesh.admit.{self.name}.{subject}", body, h).data)
            except bus.BusError as e:
                ack = {"error": {"err_code": RETRYABLE[0], "description": str(e)}}
            err = ack.get("error")
            if not err:
                self.stats["emitted"] += 1
                log("emitted", event, h[envelope.ID])
                return h[envelope.ID]
            if err.get("err_code") not in RETRYABLE:
                raise bus.BusError(f"emit {event}: refused: {err.get('description')}")
            wait = min(0.25, 0.002 * 2 ** min(attempt, 7))
            time.sleep(wait / 2 + random.random() * wait / 2)  # a back-off, not a wait for a state
        raise bus.BusError(f"emit {event}: still refused after 50 attempts")

    def handle(self, m: bus.Msg):
        subject = envelope.original_subject(m.subject)
        stored = stored_at(m.reply)
        args = (subject, m.headers, m.data)
        why = envelope.check(*args, self.self.get("signers", {}), stored, REPLAY_WINDOW, subject != m.subject)
        if why.startswith("no registered key") or why.startswith("x-signature"):
            self.self = whoami(self.nc, self.kp.public_key)  # keys change: ask once more
            why = envelope.check(*args, self.self.get("signers", {}), stored, REPLAY_WINDOW, subject != m.subject)
        if why:
            self.stats["refused"] += 1
            log("refused", subject, why)
            self.nc.publish(m.reply, f"+TERM refused by the envelope checks: {why}".encode())
            return
        event_id = m.headers[envelope.ID]
        emits = self.self.get("emits", [])
        if emits:
            self.emit(emits[0], {"handled": event_id}, event_id)
        self.nc.publish(m.reply, b"+ACK")
        self.stats["handled"] += 1
        log("handled", subject, event_id)

    def consume(self, stop: threading.Event):
        """Pulls the durable consumer <module> on EVENTS: a request on
        $JS.API.CONSUMER.MSG.NEXT.EVENTS.<module> whose reply subject, in the module's inbox,
        receives up to a batch of events and then a status (408 when the pull expires)."""
        deliveries = queue.Queue()
        inbox = f"{self.nc.inbox}.pull"
        self.nc.subscribe(inbox, deliveries.put)
        pull = json.dumps({"batch": PULL_BATCH, "expires": int(PULL_EXPIRES * 1e9)}).encode()
        while not stop.is_set() and not self.nc.closed.is_set():
            self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.EVENTS.{self.name}", pull, inbox)
            for _ in range(PULL_BATCH):
                try:
                    m = deliveries.get(timeout=PULL_EXPIRES + 1)
                except queue.Empty:
                    break
                if m.status:  # 408: the pull expired; 404/409: nothing to give, ask again
                    break
                try:
                    self.handle(m)
                except bus.BusError as e:
                    log("handler failed:", e)
                    self.nc.publish(m.reply, b'-NAK {"delay": 1000000000}')


def main() -> int:
    url = os.environ.get("MESH_URL") or os.environ.get("MESHNODE_URL") or "nats://127.0.0.1:4222"
    seed = os.environ.get("MESH_CREDS") or os.environ.get("MESHNODE_SEED") or "module.nk"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        mod = Module(url, nkey.KeyPair.from_file(seed), os.environ.get("MESH_CA", ""))
        mod.serve_tools()
        log("ready", mod.name)
        if mod.self.get("consumes"):
            threading.Thread(target=mod.consume, args=(stop,), daemon=True).start()
        while not stop.is_set() and not mod.nc.closed.is_set():
            stop.wait(0.5)
        if mod.nc.closed.is_set() and not stop.is_set():
            print("module failed: the connection to the node closed", file=sys.stderr)
            return 1
        mod.nc.close()
        return 0
    except (bus.BusError, OSError, ValueError) as e:
        print("module failed:", e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
