"""Verifying the audit chain against its seal: every entry, then the head.

:class:`ChainCheck` is fed the ``audit`` rows in sequence order, a page at a time (a store
of any engine reads them its own way), and reports every problem it finds, each with the
sequence number it concerns. The rules:

- sequence numbers start at 1 and have no gap; each entry's ``prev_hash`` is the hash of
  the entry before it (``GENESIS`` for the first): a deleted or reordered entry shows at
  the entry after it;
- a keyed entry's hash is the seal's MAC over its sequence number and fields: an edited
  entry, or one written (or recomputed) without the key, shows at itself;
- an unkeyed (``sha256:``) entry is accepted only before the head's ``keyed_from`` (the
  entries written before the store had its seal, which its first head anchored) and before
  every keyed one, so a chain rewritten with plain hashes does not pass;
- the head (persistence/audit_seal.py) must be there and carry the key's MAC; the table
  must reach its sequence number (else the newest entries were deleted), hold the head's
  hash at it (else the chain was rewritten) and count as many entries up to it. Entries
  after the head are fine when they chain: another node, or a write whose head was not yet
  replaced when the node stopped, appended them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from ratchet.persistence.admin_rows import GENESIS, AuditEntry, entry_fields, entry_hash
from ratchet.persistence.audit_seal import KEYED_PREFIX, AuditSeal, HeadState

__all__ = ["AUDIT_COLUMNS", "AuditReport", "ChainCheck", "MAX_PROBLEMS"]

#: The columns a :class:`ChainCheck` is fed, in this order.
AUDIT_COLUMNS = ("seq, tenant, at, principal, verb, command_id, task_id, outcome, detail,"
                 " prev_hash, hash")
#: At most this many problems are listed (a rewritten chain would list every entry).
MAX_PROBLEMS = 100


@dataclass
class AuditReport:
    """The answer of ``verify-audit``: ``ok`` when there is no problem."""

    entries: int
    head_seq: int | None
    problems: list[dict[str, Any]] = field(default_factory=list)
    #: Problems found beyond the :data:`MAX_PROBLEMS` listed.
    more_problems: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_wire(self) -> dict[str, Any]:
        return {"ok": self.ok, "entries": self.entries, "head_seq": self.head_seq,
                "problems": self.problems, "more_problems": self.more_problems}


class ChainCheck:
    """Args:
        seal: the store's key (None: a store without one can check only the links and
            the unkeyed hashes; its keyed entries are reported as unverifiable).
        head: the head as read *before* the first row (a head read after could name
            entries appended meanwhile and look like a truncation).
    """

    def __init__(self, seal: AuditSeal | None, head: HeadState) -> None:
        self.seal = seal
        self.head, self.head_problem = head
        self.report = AuditReport(0, self.head.seq if self.head else None)
        self._prev_seq = 0
        self._prev_hash = GENESIS
        self._keyed_seen = False
        self._hash_at_head: str | None = None
        self._upto_head = 0  # entries fed with a sequence number up to the head's

    def problem(self, seq: int, text: str) -> None:
        if len(self.report.problems) < MAX_PROBLEMS:
            self.report.problems.append({"seq": seq, "problem": text})
        else:
            self.report.more_problems += 1

    def feed(self, rows: list[tuple[Any, ...]]) -> None:
        """Check the next rows (``AUDIT_COLUMNS``, in sequence order)."""
        for row in rows:
            seq, prev, digest = int(row[0]), str(row[9]), str(row[10])
            self.report.entries += 1
            trouble = self._link_problem(seq, prev) or self._hash_problem(seq, row)
            if trouble:
                self.problem(seq, trouble)
            if self.head is not None and seq <= self.head.seq:
                self._upto_head += 1
                if seq == self.head.seq:
                    self._hash_at_head = digest
            # Go on from the entry as stored: one deleted entry is one problem, not all.
            self._prev_seq, self._prev_hash = seq, digest

    def _link_problem(self, seq: int, prev: str) -> str | None:
        if seq != self._prev_seq + 1:
            if self._prev_seq == 0:
                return f"the chain starts at {seq}, not 1: its first entries were deleted"
            return f"entries {self._prev_seq + 1}..{seq - 1} are missing (deleted)"
        if prev != self._prev_hash:
            return "does not follow the entry before it (an entry was deleted or replaced)"
        return None

    def _hash_problem(self, seq: int, row: tuple[Any, ...]) -> str | None:
        prev, digest = str(row[9]), str(row[10])
        entry = AuditEntry(row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                           dict(msgpack.unpackb(row[8], raw=False)))
        if digest.startswith(KEYED_PREFIX):
            self._keyed_seen = True
            if self.seal is None:
                return "a keyed entry, and no key to check it with"
            if digest != self.seal.entry_mac(seq, entry_fields(prev, entry)):
                return ("its MAC does not match its contents: edited, or written without"
                        " the audit key")
            return None
        if digest != entry_hash(prev, entry):
            return "its hash does not match its contents (edited)"
        if self._keyed_seen:
            return "an unkeyed entry after keyed ones: the chain was rewritten without the key"
        if self.seal is not None and (self.head is None or seq >= self.head.keyed_from):
            return ("an unkeyed entry where the audit key was in use: written or recomputed"
                    " without the key")
        return None

    def finish(self) -> AuditReport:
        """The report, once every row was fed."""
        if self.seal is None:
            return self.report
        head = self.head
        if head is None:
            self.problem(0, str(self.head_problem))
            return self.report
        if head.seq > self._prev_seq:
            self.problem(self._prev_seq + 1, f"entries {self._prev_seq + 1}..{head.seq} are"
                         " missing: the head names them (the newest entries were deleted)")
        elif head.seq > 0 and self._hash_at_head != head.hash:
            self.problem(head.seq, "differs from the head's hash: the chain was rewritten")
        elif self._upto_head != head.count:
            self.problem(head.seq, f"the table holds {self._upto_head} entries up to"
                         f" {head.seq}, the head counts {head.count}")
        return self.report
