"""Secrets sealed at rest: a pydantic ``SecretStr`` (or ``SecretBytes``) is stored as a
msgpack extension type holding its value encrypted with XChaCha20-Poly1305 (PyNaCl's
:class:`nacl.secret.Aead`) under the node's 32-byte secret key.

Where a stored value holds secrets (a task's input, a checkpointed state value, a ledger
row's arguments and result, a tool session's state), :meth:`Sealer.pack` writes each
secret leaf as ``ExtType(SEALED_STR | SEALED_BYTES, payload)`` and :meth:`Sealer.unpack`
gives the clear ``SecretStr`` back; every other leaf is plain msgpack, as before. A payload
is ``version (1) | key id (4) | nonce (24) | ciphertext and tag``; the extension code,
version and key id are the associated data, so a payload cannot be moved to another type
or passed off as another key's.

The nonce is synthetic: a keyed BLAKE2b of the plaintext (the SIV construction), so the
same secret under the same key always seals to the same bytes. Why deterministic: a state
value is diffed by its encoding at every checkpoint, and an action's request hash must be
stable across retries and restarts; random nonces would rewrite every secret at every step
and make every retried request look new. The price: equal secrets have equal ciphertexts
(who can read the database can tell that two tasks used the same secret, not which).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import nacl.exceptions
import nacl.secret
from pydantic import SecretBytes, SecretStr

from ratchet.protocol.codec import canonical
from ratchet.protocol.errors import SecretUnreadable

__all__ = ["KEY_SIZE", "SEALED_BYTES", "SEALED_CODES", "SEALED_STR", "Sealer", "key_id_of"]

#: Bytes in a secret key.
KEY_SIZE = nacl.secret.Aead.KEY_SIZE
#: msgpack extension codes of a sealed ``SecretStr`` and ``SecretBytes``.
SEALED_STR = 82
SEALED_BYTES = 83
SEALED_CODES = frozenset({SEALED_STR, SEALED_BYTES})
_VERSION = 1
_PERSON = b"ratchet.secrets"


def _derive(key: bytes, label: bytes, size: int = 32) -> bytes:
    return hashlib.blake2b(label, key=key, digest_size=size, person=_PERSON).digest()


def key_id_of(key: bytes) -> str:
    """A key's public name (8 hex digits): it says which key sealed a value, reveals nothing
    of the key, and is what a store records to refuse a node started with another key."""
    return _derive(key, b"key id", 4).hex()


class Sealer:
    """Seals and opens the secrets of stored values under one key (None: a store that has no
    key opens no sealed value and seals none — it raises :class:`SecretUnreadable`).

    Thread-safe: it holds no mutable state but a counter of opened values.
    """

    def __init__(self, key: bytes | None = None) -> None:
        if key is not None and len(key) != KEY_SIZE:
            raise ValueError(f"a secret key is {KEY_SIZE} bytes, not {len(key)}")
        self._aead = nacl.secret.Aead(_derive(key, b"seal")) if key is not None else None
        self._nonce_key = _derive(key, b"nonce") if key is not None else b""
        self.key_id: str | None = key_id_of(key) if key is not None else None
        self._id = bytes.fromhex(self.key_id) if self.key_id is not None else b""
        #: Sealed values opened so far: a caller compares it before and after a read to
        #: learn whether the read held any secret, without walking what it read.
        self.opened = 0

    def __repr__(self) -> str:
        return f"Sealer(key_id={self.key_id!r})"

    # -- at rest -------------------------------------------------------------------------

    def pack(self, value: Any) -> bytes:
        """msgpack bytes of ``value`` with its secret leaves sealed."""
        return msgpack.packb(value, use_bin_type=True, default=self.default)  # type: ignore[no-any-return]

    def unpack(self, data: bytes | bytearray) -> Any:
        """The value of :meth:`pack`'s bytes (or of plain msgpack), secrets opened.

        Raises:
            SecretUnreadable: a sealed leaf this key cannot open.
        """
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=self.ext_hook)

    def unpack_optional(self, data: bytes | None) -> Any:
        return None if data is None else self.unpack(data)

    def canonical(self, value: Any) -> bytes:
        """Canonical bytes (map keys sorted) with secrets sealed, for request hashes: stable
        for the same secret under this key, and no oracle for guessing it without the key."""
        return canonical(value, default=self.default)

    def seal_leaves(self, value: Any) -> Any:
        """``value`` with each secret leaf replaced by its sealed ``ExtType``: plain data
        that any msgpack packer writes (for rows packed where the key is not at hand)."""
        return msgpack.unpackb(self.pack(value), raw=False, strict_map_key=False)

    # -- msgpack hooks -------------------------------------------------------------------

    def default(self, obj: Any) -> msgpack.ExtType:
        """msgpack's ``default``: a secret becomes its sealed extension type."""
        if isinstance(obj, SecretStr):
            return self._seal(SEALED_STR, obj.get_secret_value().encode())
        if isinstance(obj, SecretBytes):
            return self._seal(SEALED_BYTES, obj.get_secret_value())
        raise TypeError(f"can not serialize {type(obj).__name__!r} object")

    def ext_hook(self, code: int, data: bytes) -> Any:
        """msgpack's ``ext_hook``: a sealed extension type becomes its secret again."""
        if code not in SEALED_CODES:
            return msgpack.ExtType(code, data)
        clear = self._open(code, data)
        self.opened += 1
        return SecretStr(clear.decode()) if code == SEALED_STR else SecretBytes(clear)

    # -- the AEAD ------------------------------------------------------------------------

    def _seal(self, code: int, clear: bytes) -> msgpack.ExtType:
        if self._aead is None:
            raise SecretUnreadable("a secret cannot be stored: this store has no secret key"
                                   " (RATCHET_SECRET_KEY or <state_dir>/keys/secrets.key)")
        header = bytes((_VERSION,)) + self._id
        nonce = hashlib.blake2b(bytes((code,)) + clear, key=self._nonce_key,
                                digest_size=nacl.secret.Aead.NONCE_SIZE).digest()
        sealed = self._aead.encrypt(clear, bytes((code,)) + header, nonce)
        return msgpack.ExtType(code, header + bytes(sealed))

    def _open(self, code: int, data: bytes) -> bytes:
        if len(data) < 5 or data[0] != _VERSION:
            raise SecretUnreadable("a sealed secret has an unknown format",
                                   format=data[:1].hex())
        sealed_by = data[1:5].hex()
        if self._aead is None or sealed_by != self.key_id:
            raise SecretUnreadable(
                f"a secret sealed under key {sealed_by} cannot be read with "
                + (f"key {self.key_id}" if self.key_id else "no key")
                + ": set RATCHET_SECRET_KEY (or restore <state_dir>/keys/secrets.key) to"
                " the key the store was written with", sealed_by=sealed_by,
                key_id=self.key_id)
        try:
            return self._aead.decrypt(data[5:], bytes((code,)) + data[:5])
        except nacl.exceptions.CryptoError:
            raise SecretUnreadable("a sealed secret failed authentication (altered bytes)",
                                   key_id=self.key_id) from None
