"""Sealing and ids: what an encrypted repository does to every object it writes.

`Plain` is the repository without encryption (ids are plain ids, nothing is sealed);
`Sealed` holds the two master keys: `K_enc` for ChaCha20-Poly1305 with a random 96-bit
nonce per object, `K_id` for keyed BLAKE3 storage ids. The master keys are stored sealed by
a key that scrypt derives from the passphrase (docs/formats.md section 8).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import blake3

from rdc.repo import msg

KEY_BYTES = 32
NONCE_BYTES = 12
SALT_BYTES = 16
# scrypt cost: N = 2^15, r = 8 takes 32 MiB and ~0.1 s; module variables so tests can
# make cheap keys (the parameters are stored with each key).
KDF_N = 1 << 15
KDF_R = 8
KDF_P = 1
KEY_AAD = b"rdc key"


class Crypto(Protocol):
    """What the rest of the repository needs of encryption."""

    encrypted: bool

    def storage_id(self, plain_id: bytes) -> bytes: ...

    def seal(self, plaintext: bytes, aad: bytes) -> bytes: ...

    def open(self, sealed: bytes, aad: bytes) -> bytes:
        """The plaintext; `Unauthentic` if the object was not sealed so (changed, or
        another key)."""
        ...


class Unauthentic(Exception):
    """A sealed object that does not authenticate: altered, truncated, or another key."""


class Plain:
    """No encryption: ids are plain ids, objects are stored as they are."""

    encrypted = False

    def storage_id(self, plain_id: bytes) -> bytes:
        return plain_id

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        return plaintext

    def open(self, sealed: bytes, aad: bytes) -> bytes:
        return sealed


@dataclass(frozen=True)
class MasterKeys:
    enc: bytes
    ids: bytes

    @classmethod
    def generate(cls) -> MasterKeys:
        return cls(os.urandom(KEY_BYTES), os.urandom(KEY_BYTES))


class Sealed:
    """ChaCha20-Poly1305 with random nonces, keyed BLAKE3 ids."""

    encrypted = True

    def __init__(self, keys: MasterKeys) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        self._aead = ChaCha20Poly1305(keys.enc)
        self._ids = keys.ids

    def storage_id(self, plain_id: bytes) -> bytes:
        return blake3.blake3(plain_id, key=self._ids).digest()

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext, aad)

    def open(self, sealed: bytes, aad: bytes) -> bytes:
        return _open(self._aead, sealed, aad)


def _open(aead: object, sealed: bytes, aad: bytes) -> bytes:
    from cryptography.exceptions import InvalidTag

    if len(sealed) < NONCE_BYTES + 16:
        raise Unauthentic("shorter than a nonce and a tag")
    try:
        return aead.decrypt(bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:]), aad)  # type: ignore[attr-defined]
    except InvalidTag:
        raise Unauthentic("authentication failed") from None


def _kek(passphrase: bytes, salt: bytes, n: int, r: int, p: int) -> object:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    key = Scrypt(salt=salt, length=KEY_BYTES, n=n, r=r, p=p).derive(passphrase)
    return ChaCha20Poly1305(key)


def make_key_object(passphrase: bytes, repo_id: str, keys: MasterKeys) -> bytes:
    """The content of a `keys/` object: the master keys sealed by the passphrase."""
    salt = os.urandom(SALT_BYTES)
    aead = _kek(passphrase, salt, KDF_N, KDF_R, KDF_P)
    nonce = os.urandom(NONCE_BYTES)
    inner = msg.pack({"repo": repo_id, "enc": keys.enc, "ids": keys.ids})
    sealed = nonce + aead.encrypt(nonce, inner, KEY_AAD)  # type: ignore[attr-defined]
    return msg.pack({"v": 1, "kdf": "scrypt", "n": KDF_N, "r": KDF_R, "p": KDF_P,
                     "salt": salt, "sealed": sealed})


def open_key_object(data: bytes, passphrase: bytes, repo_id: str) -> MasterKeys | None:
    """The master keys in a `keys/` object, or None if the passphrase does not open it.
    ValueError if the object is malformed."""
    outer = msg.unpack(data)
    if not isinstance(outer, dict) or outer.get("v") != 1 or outer.get("kdf") != "scrypt":
        raise ValueError("not a key object of this version")
    n, r, p, salt = outer.get("n"), outer.get("r"), outer.get("p"), outer.get("salt")
    if not (isinstance(n, int) and isinstance(r, int) and isinstance(p, int)
            and isinstance(salt, bytes) and 2 <= n <= 1 << 22 and n & (n - 1) == 0
            and 1 <= r <= 32 and 1 <= p <= 16 and isinstance(outer.get("sealed"), bytes)):
        raise ValueError("key object with implausible parameters")
    aead = _kek(passphrase, salt, n, r, p)
    try:
        inner = msg.unpack(_open(aead, outer["sealed"], KEY_AAD))
    except Unauthentic:
        return None
    if not isinstance(inner, dict) or inner.get("repo") != repo_id:
        raise ValueError("key object of another repository")
    enc, ids = inner.get("enc"), inner.get("ids")
    if not (isinstance(enc, bytes) and isinstance(ids, bytes)
            and len(enc) == len(ids) == KEY_BYTES):
        raise ValueError("key object with malformed keys")
    return MasterKeys(enc, ids)
