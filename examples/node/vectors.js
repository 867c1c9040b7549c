// Checks this implementation against meshnode's signing test vectors: node vectors.js FILE
"use strict";

const fs = require("node:fs");
const nkeys = require("nkeys.js");
const { signingInput, b64url, verify } = require("./envelope");

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
process.exit(failed ? 1 : 0);
