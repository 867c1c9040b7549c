// The meshnode event envelope (docs/envelope.md) for Node.js: ids, the signing input,
// signatures and the checks a consumer makes. Header names are exact and lower case.
"use strict";

const crypto = require("node:crypto");
const nkeys = require("nkeys.js");
const { Codec } = require("nkeys.js/lib/codec");
const { ed25519 } = require("@noble/curves/ed25519");

const H = {
  id: "x-event-id",
  source: "x-source",
  node: "x-node",
  time: "x-time",
  contentType: "content-type",
  signature: "x-signature",
  causation: "x-causation-id",
  traceparent: "traceparent",
  msgId: "Nats-Msg-Id",
};

// uuidv7 returns a new UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits
// with the version and variant set.
function uuidv7(ms = Date.now()) {
  const b = crypto.randomBytes(16);
  b.writeUIntBE(ms, 0, 6);
  b[6] = (b[6] & 0x0f) | 0x70;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = b.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

const UUIDV7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

// idTime is the time a UUIDv7 holds, as x-time writes it: RFC 3339, UTC, milliseconds.
function idTime(id) {
  const ms = parseInt(id.replaceAll("-", "").slice(0, 12), 16);
  return new Date(ms).toISOString();
}

// signingInput is what x-signature signs, as bytes.
function signingInput(id, time, subject, source, body) {
  const sum = crypto.createHash("sha256").update(body).digest("hex");
  return Buffer.from(`${id}\n${time}\n${subject}\n${source}\n${sum}`, "utf8");
}

// b64url is base64url without padding.
const b64url = (buf) => Buffer.from(buf).toString("base64url");

// stamp sets the envelope of an event body published on subject by source, signed with the
// key pair kp (nkeys.js), on the nats.js headers h.
function stamp(h, kp, { source, node, subject, body, causation, traceparent }) {
  const id = uuidv7();
  const time = idTime(id);
  h.set(H.id, id);
  h.set(H.source, source);
  h.set(H.node, node);
  h.set(H.time, time);
  h.set(H.contentType, "application/json");
  h.set(H.signature, b64url(kp.sign(signingInput(id, time, subject, source, body))));
  h.set(H.msgId, id);
  if (causation) h.set(H.causation, causation);
  if (traceparent) h.set(H.traceparent, traceparent);
  return id;
}

// verify reports whether the signature sig (base64url) over the fields was made by the nkey
// public key pub.
function verify(pub, sig, id, time, subject, source, body) {
  let raw;
  try {
    nkeys.fromPublic(pub); // a public key's prefix, and its checksum
    raw = Codec._decode(new TextEncoder().encode(pub)).slice(1); // the key's 32 bytes
  } catch {
    return false;
  }
  return verifyRaw(raw, signingInput(id, time, subject, source, body), Buffer.from(sig, "base64url"));
}

// verifyRaw reports whether sig is key's signature over message under the mesh's rule
// (docs/envelope.md, "The signature rule"): RFC 8032's cofactored equation with canonical
// encodings and S below the group order, and no key of small order — FIPS 186-5's, what
// noble-curves checks with zip215 off. tweetnacl (nkeys.js) checks the cofactorless equation
// and not S's range, and would part from the mesh on crafted signatures.
function verifyRaw(key, message, sig) {
  try {
    return sig.length === 64 && ed25519.verify(sig, message, key, { zip215: false });
  } catch {
    return false;
  }
}

// originalSubject is the subject an event was first published on: a replay arrives on
// mesh.replay.<consumer>.<original subject>.
function originalSubject(subject) {
  const m = /^mesh\.replay\.[^.]+\.(mesh\..+)$/.exec(subject);
  return m ? m[1] : subject;
}

// check returns "" when a delivered event may be handed to a handler, else why not.
// signers are whoami's keys ("mod:<module>", "seat:<seat>", "node:<server>"); stored is
// when the stream stored the message (ms); windowMs bounds x-time's distance from it.
function check(subject, h, body, signers, stored, windowMs, replay) {
  for (const name of [H.id, H.source, H.node, H.time, H.contentType, H.signature]) {
    if (!h || !h.get(name)) return `missing envelope header ${name}`;
  }
  const id = h.get(H.id), source = h.get(H.source), time = h.get(H.time);
  if (!UUIDV7.test(id)) return `x-event-id ${JSON.stringify(id)} is not a UUIDv7`;
  const [, kind, owner] = subject.split(".");
  let key;
  if (kind === "mod") {
    if (source !== owner) return `x-source ${JSON.stringify(source)} does not own ${subject}`;
    key = signers[`mod:${owner}`];
  } else if (kind === "node") {
    key = signers[`node:${source}`];
  } else if (kind === "seat") {
    key = signers[`seat:${owner}`];
    if (source !== owner && (!key || signers[`mod:${source}`] !== key)) {
      return `x-source ${JSON.stringify(source)} does not own ${subject}`;
    }
  }
  if (!key) return `no registered key for x-source ${JSON.stringify(source)}`;
  if (!verify(key, h.get(H.signature), id, time, subject, source, body)) return `x-signature is not ${source}'s`;
  const t = Date.parse(time);
  if (!replay && windowMs > 0 && !(Math.abs(stored - t) <= windowMs)) return `x-time ${time} is outside the replay window`;
  return "";
}

module.exports = { H, uuidv7, idTime, signingInput, b64url, stamp, verify, verifyRaw, originalSubject, check };
