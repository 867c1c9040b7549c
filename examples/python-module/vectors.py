"""Checks this implementation against meshnode's signing test vectors and the signature
rule's edge cases: python3 vectors.py [VECTORS [EDGE]]"""

import json
import sys

import envelope
import nkey


def main(path: str, edge_path: str) -> int:
    with open(path, encoding="utf-8") as f:
        vectors = json.load(f)
    failed = 0
    for v in vectors:
        kp = nkey.KeyPair(v["seed"])
        body = v["body"].encode()
        args = (v["x_event_id"], v["x_time"], v["subject"], v["x_source"])
        problems = []
        if envelope.signing_input(*args, body).decode() != v["signing_input"]:
            problems.append("signing input differs")
        if kp.public_key != v["public_key"]:
            problems.append("public key differs")
        if envelope.b64url(kp.sign(envelope.signing_input(*args, body))) != v["x_signature"]:
            problems.append("signature differs")
        if not envelope.verify(v["public_key"], v["x_signature"], *args, body):
            problems.append("does not verify")
        if envelope.verify(v["public_key"], v["x_signature"], *args, body + b" "):
            problems.append("verifies another body")
        print(("FAIL " if problems else "ok   ") + v["name"] + (": " + ", ".join(problems) if problems else ""))
        failed += bool(problems)
    print(f"{len(vectors) - failed} of {len(vectors)} vectors ok")

    # The signature rule's edge cases: each verdict must be the Go code's (docs/envelope.md).
    with open(edge_path, encoding="utf-8") as f:
        edge = json.load(f)
    edge_failed = 0
    for v in edge:
        got = nkey.verify_raw(bytes.fromhex(v["public_key"]), bytes.fromhex(v["signature"]), bytes.fromhex(v["message"]))
        if got != v["valid"]:
            print(f"FAIL edge: {v['name']}: {'accepted' if got else 'refused'}, the rule says {'valid' if v['valid'] else 'invalid'}")
            edge_failed += 1
    print(f"{len(edge) - edge_failed} of {len(edge)} edge cases agree with the rule")
    return 1 if failed or edge_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "../../envelope/testdata/vectors.json",
                  sys.argv[2] if len(sys.argv) > 2 else "../../envelope/testdata/ed25519-edge.json"))
