"""Checks this implementation against meshnode's signing test vectors:
python3 vectors.py ../../envelope/testdata/vectors.json"""

import json
import sys

import envelope
import nkey


def main(path: str) -> int:
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "../../envelope/testdata/vectors.json"))
