"""The audit chain's seal: a key the database does not hold, and a head kept outside it.

The audit table (persistence/admin_rows.py) is a hash chain, but a chain alone proves
nothing to someone who can write the database file: they can edit an entry and recompute
every hash after it, or delete the newest entries. Two things outside the table close
that:

- **The key**, given to the node (``RATCHET_AUDIT_KEY`` or ``--audit-key-file``: what nodes
  on several machines share), else ``<state_dir>/keys/audit.key`` (32 random bytes, hex,
  mode 0600, created on the first start): every entry's hash is an HMAC-SHA256 under it, over the entry, its
  sequence number and the previous entry's hash. Without the key nobody can produce a
  valid entry, so an edit, a deleted middle entry or a recomputed chain shows.
- **The head**, ``<state_dir>/audit.head`` (JSON, mode 0600, replaced atomically after every
  audit write): the last sequence number, its hash and the count of entries, with an HMAC
  under the same key. Deleting the newest entries leaves the head pointing past the end.

The head only moves forward (a lock file serialises the processes of one state directory)
and is written *after* the entry's commit: a crash in between leaves it one write behind,
which verification accepts (entries after the head must chain and carry valid MACs), never
ahead of the table. Several nodes on one machine share its state directory, hence the key and
the head; nodes on several machines share the key (given) and each keeps its own head, which
tolerates the entries other nodes append after it. The database holds a check value of the
key (:meth:`AuditSeal.key_check`, persistence/audit_key.py), never the key: a node started
with another key is refused before it writes or judges anything. Nothing here is fsynced but the key: a head lost in an OS crash is an old head,
and an old head is tolerated the same way.

What the seal cannot show: entries written after the head was last replaced and then
deleted before anyone looked (at most the writes in flight when the head was last
replaced, or every write since, if someone with write access to the state directory put an
older head back); and anything done by someone who holds the key.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ratchet.protocol.codec import canonical
from ratchet.protocol.private_files import write_private

__all__ = ["AuditHead", "AuditSeal", "GENESIS", "KEYED_PREFIX", "HeadState"]

#: The ``prev_hash`` of the first entry.
GENESIS = "sha256:" + "0" * 64
#: The prefix of a keyed entry's hash (an unkeyed one, written before the seal, is
#: ``sha256:``).
KEYED_PREFIX = "hmac-sha256:"
_KEY_BYTES = 32
#: What the head's MAC covers before its fields: a head can never pass for an entry.
_HEAD_TAG = "audit-head"
_ENTRY_TAG = "audit-entry"
#: What the key's check value is the MAC of (distinct from every entry and head).
_CHECK_TAG = b"ratchet audit key check v1"


@dataclass(frozen=True, slots=True)
class AuditHead:
    """The newest entry as of a write: its sequence number, its hash, and how many entries
    the table held up to it; and the first sequence number that must be keyed (the entries
    before it were written before the store had a seal)."""

    seq: int
    hash: str
    count: int
    keyed_from: int = 1


#: ``read_head``'s answer: the head, or None with why not ("missing", "unreadable", ...).
HeadState = tuple[AuditHead | None, str | None]


class AuditSeal:
    """The key and the head file of one state directory. Open with :meth:`open`.

    Every method does blocking file I/O: call it from a thread (``asyncio.to_thread``)
    or from the store's writer thread."""

    def __init__(self, state_dir: Path, key: bytes, fresh: bool) -> None:
        self.state_dir = Path(state_dir)
        self._key = key
        #: True when this process created the key (the first start on this state directory).
        self.fresh = fresh
        #: The head as last read or written, with the file's (inode, mtime, size) then:
        #: an append reads it for every entry, and re-reading and re-MACing the file each
        #: time cost ~0.2 ms per entry. Checks of the chain always read the file itself.
        self._cached: tuple[tuple[int, int, int], HeadState] | None = None
        #: The files :meth:`open` created (the head, the key): :meth:`discard` removes them.
        self._made: list[Path] = []

    @property
    def head_path(self) -> Path:
        return self.state_dir / "audit.head"

    @property
    def _lock_path(self) -> Path:
        return self.state_dir / "audit.head.lock"

    @classmethod
    def open(cls, state_dir: Path, key: bytes | None = None) -> AuditSeal:
        """The state directory's seal; creates the key (and a head at the empty chain) on
        the first start. Raises ``ValueError`` for a key file that is not a key: a new key
        would make every entry already written unverifiable, so none is made silently.

        ``key``: the key given to the node (32 bytes; no key file is read or written); the
        head is created at the empty chain if this state directory has none yet."""
        state_dir = Path(state_dir)
        key_path = state_dir / "keys" / "audit.key"
        state_dir.mkdir(parents=True, exist_ok=True)
        if key is not None and len(key) != _KEY_BYTES:
            raise ValueError(f"an audit key is {_KEY_BYTES} bytes, this one {len(key)}")
        with _locked(state_dir / "audit.head.lock"):
            if key is not None:
                seal = cls(state_dir, key, fresh=not (state_dir / "audit.head").exists())
                if seal.fresh:
                    seal._write_head(AuditHead(0, GENESIS, 0))
                    seal._made = [seal.head_path]
                return seal
            if key_path.exists():
                return cls(state_dir, _read_key(key_path), fresh=False)
            key = secrets.token_bytes(_KEY_BYTES)
            seal = cls(state_dir, key, fresh=True)
            # The head first, then the key: a crash between leaves no key, so the next
            # start makes a new one and a new head (never a key without its head).
            seal._write_head(AuditHead(0, GENESIS, 0))
            _write_key(key_path, key)
            seal._made = [seal.head_path, key_path]
            return seal

    def discard(self) -> None:
        """Remove the head (and key) files this process created: a start refused because
        the store's chain is under another key leaves nothing under this one behind (a
        head that a later start with the right key would report as forged). Files it found
        are never removed: they are the evidence."""
        with _locked(self._lock_path):
            for path in self._made:
                path.unlink(missing_ok=True)
            self._made = []

    def entry_mac(self, seq: int, body: list[object]) -> str:
        """The hash of the entry ``seq`` whose fields (previous hash first) are ``body``."""
        data = canonical([_ENTRY_TAG, seq, *body])
        return KEYED_PREFIX + hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def key_check(self) -> str:
        """The key's check value: a MAC of a fixed string under it. Stored in the database,
        it tells a node started with another key from a tampered chain; it reveals nothing
        of the key (HMAC-SHA256 is a PRF)."""
        return KEYED_PREFIX + hmac.new(self._key, _CHECK_TAG, hashlib.sha256).hexdigest()

    def _head_mac(self, head: AuditHead) -> str:
        data = canonical([_HEAD_TAG, head.seq, head.hash, head.count, head.keyed_from])
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def _file_signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.head_path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def current_head(self) -> HeadState:
        """:meth:`read_head`, from the cache while the file is the one last seen."""
        signature = self._file_signature()
        cached = self._cached
        if cached is not None and signature is not None and cached[0] == signature:
            return cached[1]
        state = self.read_head()
        self._cached = (signature, state) if signature is not None else None
        return state

    def read_head(self) -> HeadState:
        """The head and None, or None and why there is none to trust (read from the file)."""
        try:
            raw = json.loads(self.head_path.read_text())
            head = AuditHead(int(raw["seq"]), str(raw["hash"]), int(raw["count"]),
                             int(raw["keyed_from"]))
            mac = str(raw["mac"])
        except FileNotFoundError:
            return None, f"the head file {self.head_path} is missing"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"the head file {self.head_path} is unreadable ({exc!r:.200})"
        if not hmac.compare_digest(mac, self._head_mac(head)):
            return None, f"the head file {self.head_path} does not carry this key's MAC"
        return head, None

    def advance(self, head: AuditHead) -> bool:
        """Replace the head with ``head`` (``keyed_from`` kept) if it is newer; True if it
        did.

        A missing or untrusted head file is left as it is: rewriting it would erase the
        evidence that someone removed or forged it (the key's creation writes the first)."""
        with _locked(self._lock_path):
            current, _ = self.current_head()
            if current is None or current.seq >= head.seq:
                return False
            written = replace(head, keyed_from=current.keyed_from)
            self._write_head(written)
            signature = self._file_signature()
            self._cached = (signature, (written, None)) if signature is not None else None
            return True

    def anchor(self, head: AuditHead) -> bool:
        """On the first start with a seal: take the entries already in the table (unkeyed,
        written before the seal existed) under the head; every later one must be keyed."""
        with _locked(self._lock_path):
            current, _ = self.read_head()
            if not self.fresh or current is None or current.seq >= head.seq:
                return False
            self._write_head(replace(head, keyed_from=head.seq + 1))
            return True

    def _write_head(self, head: AuditHead) -> None:
        record = {"seq": head.seq, "hash": head.hash, "count": head.count,
                  "keyed_from": head.keyed_from, "mac": self._head_mac(head)}
        write_private(self.head_path, (json.dumps(record, sort_keys=True) + "\n").encode())


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created 0600) for the ``with`` block: the
    processes sharing a state directory replace the head one at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _read_key(path: Path) -> bytes:
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != _KEY_BYTES:
        raise ValueError(f"{path} is not an audit key ({_KEY_BYTES} bytes as hex); restore it"
                         " from its backup (a new key cannot check the entries already written)")
    return key


def _write_key(path: Path, key: bytes) -> None:
    """Write the key whole and durably before it appears under its name."""
    # Durable, name included: losing the key loses every entry's proof.
    write_private(path, (key.hex() + "\n").encode(), durable=True)
