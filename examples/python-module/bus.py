"""A minimal NATS client on the standard library: what a meshnode module needs of the bus
(connect with an nkey, publish with headers, subscribe in a queue group, request/reply).
The protocol is NATS's text protocol (https://docs.nats.io/reference/reference-protocols/nats-protocol).

It does not reconnect: a module that loses its connection exits non-zero, and whatever runs
it (the node, for a deployed module; systemd) starts it again."""

import itertools
import json
import os
import queue
import socket
import ssl
import sys
import threading
import urllib.parse

import envelope


class Msg:
    """A delivered message: subject, reply subject, headers (first value of each name, as
    sent: names are case-sensitive), status ("" or the code of a status message: 404, 408,
    503) and body."""

    def __init__(self, subject: str, reply: str, headers: dict, status: str, data: bytes):
        self.subject, self.reply, self.headers, self.status, self.data = subject, reply, headers, status, data


class BusError(Exception):
    """The server refused the connection or a request went unanswered."""


def _parse_headers(block: bytes) -> tuple[dict, str]:
    lines = block.decode("utf-8", "replace").split("\r\n")
    status = lines[0][len("NATS/1.0"):].strip().split(" ", 1)[0] if lines[0].startswith("NATS/1.0") else ""
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers.setdefault(k.strip(), v.strip())
    return headers, status


def _header_block(headers: dict) -> bytes:
    return ("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()


class Conn:
    """One connection to a node's client port, authenticated by the nkey kp. Every inbox
    of its requests lies under inbox (the bus lets a module subscribe only under its own)."""

    def __init__(self, url: str, kp, inbox: str, name: str, ca: str = ""):
        u = urllib.parse.urlparse(url if "://" in url else "nats://" + url)
        self.inbox = inbox
        self._sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 4222), timeout=10)
        self._rfile = self._sock.makefile("rb")
        line = self._rfile.readline()
        if not line.startswith(b"INFO "):
            raise BusError(f"{url} is not a NATS server: it said {line[:80]!r}")
        self.info = json.loads(line[5:])
        if self.info.get("tls_required") or u.scheme == "tls":
            ctx = ssl.create_default_context(cafile=ca or None)
            self._sock = ctx.wrap_socket(self._sock, server_hostname=u.hostname)
            self._rfile = self._sock.makefile("rb")
        self._wlock = threading.Lock()
        self._sids = itertools.count(1)
        self._subs = {}  # sid → callback(Msg)
        self._replies = {}  # request token → queue of its answer
        self._tokens = itertools.count(1)
        self.closed = threading.Event()
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True, "protocol": 1,
                   "lang": "python3", "version": "0", "name": name, "nkey": kp.public_key,
                   "sig": envelope.b64url(kp.sign(self.info.get("nonce", "").encode()))}
        self._send(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        while True:  # the server answers the PING once it has accepted the CONNECT
            line = self._rfile.readline()
            if line.startswith(b"-ERR") or not line:
                raise BusError(f"{url} refused key {kp.public_key}: {line.decode().strip() or 'connection closed'}")
            if line.startswith(b"PONG"):
                break
        self._sock.settimeout(None)
        self._resp_sid = self.subscribe(f"{inbox}.{os.getpid()}.*", self._on_reply)
        threading.Thread(target=self._read, daemon=True).start()

    def _send(self, data: bytes):
        with self._wlock:
            self._sock.sendall(data)

    def publish(self, subject: str, data: bytes = b"", reply: str = "", headers: dict | None = None):
        """Publishes data on subject, with headers (HPUB) when given."""
        r = f" {reply}" if reply else ""
        if headers:
            hb = _header_block(headers)
            self._send(f"HPUB {subject}{r} {len(hb)} {len(hb) + len(data)}\r\n".encode() + hb + data + b"\r\n")
        else:
            self._send(f"PUB {subject}{r} {len(data)}\r\n".encode() + data + b"\r\n")

    def subscribe(self, subject: str, callback, queue_group: str = "") -> int:
        """Calls callback(Msg) for every message on subject, on the reader's thread: a
        callback that waits for the bus (a request) must hand the message to another thread."""
        sid = next(self._sids)
        self._subs[sid] = callback
        self._send(f"SUB {subject}{' ' + queue_group if queue_group else ''} {sid}\r\n".encode())
        return sid

    def request(self, subject: str, data: bytes, headers: dict | None = None, timeout: float = 10) -> Msg:
        """Publishes data on subject with a reply subject in this connection's inbox and
        returns the answer; no responder (status 503) and no answer in time are BusErrors."""
        token = str(next(self._tokens))
        q = queue.Queue(1)
        self._replies[token] = q
        try:
            self.publish(subject, data, f"{self.inbox}.{os.getpid()}.{token}", headers)
            try:
                m = q.get(timeout=timeout)
            except queue.Empty:
                raise BusError(f"no answer on {subject} within {timeout:g}s") from None
        finally:
            self._replies.pop(token, None)
        if m.status == "503":
            raise BusError(f"nobody answers on {subject}")
        return m

    def _on_reply(self, m: Msg):
        q = self._replies.get(m.subject.rsplit(".", 1)[-1])
        if q is not None:
            q.put_nowait(m)

    def _read(self):
        try:
            while True:
                line = self._rfile.readline()
                if not line:
                    break
                op = line.split(b" ", 1)[0].strip().upper()
                if op in (b"MSG", b"HMSG"):
                    args = line.decode().split()
                    size = int(args[-1])
                    hsize = int(args[-2]) if op == b"HMSG" else 0
                    reply = args[3] if len(args) == (6 if op == b"HMSG" else 5) else ""
                    payload = self._rfile.read(size + 2)[:size]
                    headers, status = _parse_headers(payload[:hsize]) if hsize else ({}, "")
                    cb = self._subs.get(int(args[2]))
                    if cb:
                        cb(Msg(args[1], reply, headers, status, payload[hsize:]))
                elif op == b"PING":
                    self._send(b"PONG\r\n")
                elif op == b"-ERR":
                    # A permission violation leaves the connection open; the rest close it.
                    print("bus:", line.decode().strip(), file=sys.stderr, flush=True)
        except OSError:
            pass
        finally:
            self.closed.set()

    def close(self):
        """Closes the connection, after flushing what was published."""
        try:
            self._send(b"PING\r\n")
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
