// Checks this implementation against meshnode's signing test vectors and the signature
// rule's edge cases: node vectors.js [VECTORS [EDGE]]
"use strict";

const fs = require("node:fs");
const nkeys = require("nkeys.js");
const { signingInput, b64url, verify, verifyRaw } = require("./envelope");

const vectors = JSON.parse(fs.readFileSync(process.argv[2] || "../../envelope/testdata/vectors.json", "utf8"));
let failed = 0;
for (const v of vectors) {
  const kp = nkeys.fromSeed(Buffer.from(v.seed));
  const input = signingInput(v.x_event_id, v.x_time, v.subject, v.x_source, Buffer.from(v.body, "utf8"));
  const problems = [];
  if (input.toString("utf8") !== v.signing_input) problems.push("signing input differs");
  if (kp.getPublicKey() !== v.public_key) problems.push("public key differs");
  if (b64url(kp.sign(input)) !== v.x_signature) problems.push("signature differs");
  if (!verify(v.public_key, v.x_signature, v.x_event_id, v.x_time, v.subject, v.x_source, Buffer.from(v.body, "utf8"))) problems.push("does not verify");
  if (verify(v.public_key, v.x_signature, v.x_event_id, v.x_time, v.subject, v.x_source, Buffer.from(v.body + " ", "utf8"))) problems.push("verifies another body");
  console.log(`${problems.length ? "FAIL" : "ok  "} ${v.name}${problems.length ? ": " + problems.join(", ") : ""}`);
  failed += problems.length ? 1 : 0;
}
console.log(`${vectors.length - failed} of ${vectors.length} vectors ok`);

// The signature rule's edge cases: each verdict must be the Go code's (docs/envelope.md).
const edge = JSON.parse(fs.readFileSync(process.argv[3] || "../../envelope/testdata/ed25519-edge.json", "utf8"));
let edgeFailed = 0;
for (const v of edge) {
  const got = verifyRaw(Buffer.from(v.public_key, "hex"), Buffer.from(v.message, "hex"), Buffer.from(v.signature, "hex"));
  if (got !== v.valid) {
    console.log(`FAIL edge: ${v.name}: ${got ? "accepted" : "refused"}, the rule says ${v.valid ? "valid" : "invalid"}`);
    edgeFailed++;
  }
}
console.log(`${edge.length - edgeFailed} of ${edge.length} edge cases agree with the rule`);
process.exit(failed || edgeFailed ? 1 : 0);
