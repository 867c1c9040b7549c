"""NATS nkeys, as meshnode's seed files hold them (docs/guide/module-without-sdk.md, "Seeds").

A seed file holds one line, "SU" and 56 more base32 characters: base32 (RFC 4648, no
padding) of two prefix bytes, the 32-byte Ed25519 seed and a CRC-16/XMODEM of the first 34
bytes, little-endian. A public key ("U…", 56 characters) is base32 of the prefix byte of a
user key (20 << 3), the 32-byte public key and the CRC of those 33 bytes.
"""

import base64
import hashlib
import re

import nacl.bindings
import nacl.signing

PREFIX_SEED = 18 << 3  # "S"
PREFIX_USER = 20 << 3  # "U": a module's key is a user key of the bus


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), as nkeys checks every key with."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def _b32decode(s: str) -> bytes:
    return base64.b32decode(s + "=" * (-len(s) % 8))


def _checked(raw: bytes) -> bytes:
    if len(raw) < 3 or int.from_bytes(raw[-2:], "little") != crc16(raw[:-2]):
        raise ValueError("not an nkey: its checksum does not match")
    return raw[:-2]


def decode_seed(seed: str) -> tuple[int, bytes]:
    """Returns the kind of key ("U" is PREFIX_USER) and the 32-byte Ed25519 seed of an nkey seed."""
    raw = _checked(_b32decode(seed.strip()))
    if len(raw) != 34 or raw[0] & 0xF8 != PREFIX_SEED:
        raise ValueError("not an nkey seed: it must begin with S and be 58 characters")
    kind = ((raw[0] & 0x07) << 5) | ((raw[1] & 0xF8) >> 3)
    return kind, raw[2:]


def encode_public(kind: int, key: bytes) -> str:
    """The nkey public key of a 32-byte Ed25519 public key of the given kind."""
    raw = bytes([kind]) + key
    return base64.b32encode(raw + crc16(raw).to_bytes(2, "little")).decode().rstrip("=")


def decode_public(public: str) -> bytes:
    """The 32-byte Ed25519 public key of an nkey public key."""
    raw = _checked(_b32decode(public))
    if len(raw) != 33:
        raise ValueError(f"not an nkey public key: {public!r}")
    return raw[1:]


SEED_RE = re.compile(r"\bS[A-Z2-7]{57}\b")


class KeyPair:
    """An nkey's signing key: what a module signs its events and its connections with."""

    def __init__(self, seed: str):
        kind, raw = decode_seed(seed)
        self.kind = kind
        self.signing = nacl.signing.SigningKey(raw)
        self.public_key = encode_public(kind, bytes(self.signing.verify_key))

    @classmethod
    def from_file(cls, path: str) -> "KeyPair":
        """Reads a seed file: the seed alone, or a NATS credentials file holding one."""
        with open(path, encoding="utf-8") as f:
            m = SEED_RE.search(f.read(4096))
        if not m:
            raise ValueError(f"{path} holds no nkey seed (S…, 58 characters): pass the file `meshnode module register --creds-out` wrote")
        return cls(m.group(0))

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of data."""
        return self.signing.sign(data).signature


def verify(public: str, signature: bytes, data: bytes) -> bool:
    """Reports whether signature over data was made by the nkey public key public."""
    try:
        key = decode_public(public)
    except Exception:  # not a public key
        return False
    return verify_raw(key, signature, data)


# The group's order and the field's prime.
L = 2**252 + 27742317777372353535851937790883648493
P = 2**255 - 19
IDENTITY = bytes([1]) + bytes(31)


def verify_raw(key: bytes, signature: bytes, data: bytes) -> bool:
    """Reports whether signature is key's over data under the mesh's rule (docs/envelope.md,
    "The signature rule"): S below the group order, the key and R canonically encoded, the key
    not of small order, and [8][S]B = [8]R + [8][k]A (RFC 8032's cofactored equation, FIPS
    186-5's rule).

    libsodium's verification (PyNaCl's) accepts a subset of it: it also refuses R of small
    order and checks the cofactorless equation. What it accepts is accepted; what it refuses
    is checked again with the cofactored equation, from libsodium's point operations."""
    if len(key) != 32 or len(signature) != 64:
        return False
    try:
        nacl.signing.VerifyKey(key).verify(data, signature)
        return True
    except Exception:  # refused by libsodium: the rule may still accept it
        pass
    r, s = signature[:32], int.from_bytes(signature[32:], "little")
    if s >= L or not _canonical(key) or not _canonical(r):
        return False
    try:
        a8, r8 = _times8(key), _times8(r)  # fails for a point not on the curve
        if a8 == IDENTITY:
            return False  # a key of small order
        k = int.from_bytes(hashlib.sha512(r + key + data).digest(), "little") % L
        left = _base_times((8 * s) % L)  # [8][S]B, B of prime order
        right = nacl.bindings.crypto_core_ed25519_add(r8, _times(k, a8))
    except Exception:
        return False
    return left == right


def _canonical(point: bytes) -> bool:
    """y below the prime, and no sign bit where x is 0 (y = 1 or y = P - 1)."""
    y = int.from_bytes(point, "little") & ((1 << 255) - 1)
    return y < P and not (point[31] & 0x80 and y in (1, P - 1))


def _times8(point: bytes) -> bytes:
    for _ in range(3):
        point = nacl.bindings.crypto_core_ed25519_add(point, point)
    return point


def _base_times(n: int) -> bytes:
    if n == 0:
        return IDENTITY  # libsodium refuses to return the identity
    return nacl.bindings.crypto_scalarmult_ed25519_base_noclamp(n.to_bytes(32, "little"))


def _times(n: int, point: bytes) -> bytes:
    """[n]point, for a point of prime order other than the identity."""
    if n == 0:
        return IDENTITY
    return nacl.bindings.crypto_scalarmult_ed25519_noclamp(n.to_bytes(32, "little"), point)
