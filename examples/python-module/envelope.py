"""The meshnode event envelope (docs/envelope.md): ids, the signing input, signatures and the
checks a consumer makes. Header names are exact and lower case."""

import base64
import datetime
import hashlib
import json
import os
import re
import time

import nkey

ID, SOURCE, NODE, TIME = "x-event-id", "x-source", "x-node", "x-time"
CONTENT_TYPE, SIGNATURE, CAUSATION, MSG_ID = "content-type", "x-signature", "x-causation-id", "Nats-Msg-Id"
REQUIRED = (ID, SOURCE, NODE, TIME, CONTENT_TYPE, SIGNATURE)

UUIDV7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def uuidv7(ms: int | None = None) -> str:
    """A new UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits with the
    version and variant set."""
    ms = int(time.time() * 1000) if ms is None else ms
    b = bytearray(ms.to_bytes(6, "big") + os.urandom(10))
    b[6] = (b[6] & 0x0F) | 0x70
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def id_time(event_id: str) -> str:
    """x-time of an event: its id's millisecond, RFC 3339 in UTC as Go's RFC3339Nano writes it
    (trailing zeros of the fraction dropped, no fraction at all for a whole second)."""
    ms = int(event_id.replace("-", "")[:12], 16)
    t = datetime.datetime.fromtimestamp(ms // 1000, datetime.timezone.utc)
    frac = f"{ms % 1000:03d}".rstrip("0")
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def parse_time(s: str) -> float:
    """Seconds since the epoch of an x-time (RFC 3339, any fraction, Z or an offset)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", s)
    if not m:
        raise ValueError(f"x-time {s!r} is not RFC 3339")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    t = datetime.datetime.fromisoformat(m.group(1) + zone).timestamp()
    return t + (float("0." + m.group(2)) if m.group(2) else 0.0)


def signing_input(event_id: str, x_time: str, subject: str, source: str, body: bytes) -> bytes:
    """What x-signature signs: id, time, subject, source and hex(sha256(body)), joined by \\n."""
    return f"{event_id}\n{x_time}\n{subject}\n{source}\n{hashlib.sha256(body).hexdigest()}".encode()


def b64url(b: bytes) -> str:
    """base64url without padding."""
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def unb64url(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def stamp(kp: nkey.KeyPair, source: str, node: str, subject: str, body: bytes, causation: str = "") -> dict:
    """The envelope's headers of body, published on subject by source, signed with kp."""
    event_id = uuidv7()
    x_time = id_time(event_id)
    h = {ID: event_id, SOURCE: source, NODE: node, TIME: x_time, CONTENT_TYPE: "application/json",
         SIGNATURE: b64url(kp.sign(signing_input(event_id, x_time, subject, source, body))), MSG_ID: event_id}
    if causation:
        h[CAUSATION] = causation
    return h


def verify(public: str, signature: str, event_id: str, x_time: str, subject: str, source: str, body: bytes) -> bool:
    """Reports whether signature (base64url) over the fields was made by the nkey public key."""
    try:
        sig = unb64url(signature)
    except ValueError:
        return False
    return nkey.verify(public, sig, signing_input(event_id, x_time, subject, source, body))


REPLAY = re.compile(r"^mesh\.replay\.[^.]+\.(mesh\..+)$")


def original_subject(subject: str) -> str:
    """The subject an event was first published on: a replay arrives on
    mesh.replay.<consumer>.<original subject>."""
    m = REPLAY.match(subject)
    return m.group(1) if m else subject


def check(subject: str, h: dict, body: bytes, signers: dict, stored: float, window: float, replay: bool) -> str:
    """"" when a delivered event may be handled, else why not. signers are whoami's keys
    ("mod:<module>", "seat:<seat>", "node:<server>"); stored is when the stream stored the
    message (seconds since the epoch); window bounds x-time's distance from it."""
    for name in REQUIRED:
        if not h.get(name):
            return f"missing envelope header {name}"
    event_id, source, x_time = h[ID], h[SOURCE], h[TIME]
    if not UUIDV7.match(event_id):
        return f"x-event-id {json.dumps(event_id)} is not a UUIDv7"
    parts = subject.split(".")
    kind, owner = (parts[1], parts[2]) if len(parts) > 2 else ("", "")
    key = None
    if kind == "mod":
        if source != owner:
            return f"x-source {json.dumps(source)} does not own {subject}"
        key = signers.get(f"mod:{owner}")
    elif kind == "node":
        key = signers.get(f"node:{source}")
    elif kind == "seat":
        key = signers.get(f"seat:{owner}")
        if source != owner and (not key or signers.get(f"mod:{source}") != key):
            return f"x-source {json.dumps(source)} does not own {subject}"
    if not key:
        return f"no registered key for x-source {json.dumps(source)}"
    if not verify(key, h[SIGNATURE], event_id, x_time, subject, source, body):
        return f"x-signature is not {source}'s"
    try:
        t = parse_time(x_time)
    except ValueError as e:
        return str(e)
    if not replay and window > 0 and abs(stored - t) > window:
        return f"x-time {x_time} is outside the replay window"
    return ""
