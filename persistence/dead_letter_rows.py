"""Dead letters (the ``dead_letters`` table, bounded): recording one, and what ``admin dlq``
reads and does with them (:class:`DeadLetterStore`, part of ``StorePort``; the SQLite
store's :class:`DeadLetterRows`, a mixin of ``Store``).

Bounds. A flood of garbage must not fill the disk: each recording trims the table to
:class:`DeadLetterLimits` (the oldest letters go first), in the recording's own
transaction, so the table never holds more than ``max_rows`` letters nor (beyond the one
just recorded) more than ``max_bytes`` of raw messages. The ``RATCHET_DLQ`` stream is
bounded on its own (actors/transport/bus.py, ``StreamLimits``).

Replays. A replay republishes the original message, with its original headers (not
``Nats-*`` ones: a replay gets a fresh message id, or JetStream's duplicate window would
drop it), to its original subject through the outbox, in the transaction that counts the
replay. The replayed message carries ``Ratchet-Replay-Of: <first letter's id>``; if it is
dead-lettered again, its new letter points at that first letter, whose count bounds the
replays of the whole chain (:data:`MAX_REPLAYS`): a poison message goes back to the DLQ
and stays there, never round a loop.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgpack

from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.store_rows import _StoreParts
from ratchet.persistence.txn_events import OutboxRow, insert_outbox
from ratchet.protocol.ids import new_id

__all__ = ["DeadLetterLimits", "DeadLetterRows", "DeadLetterStore", "MAX_REPLAYS",
           "REPLAY_HEADER", "record_dead_letter_txn"]

#: Times the messages of one chain of dead letters may be replayed.
MAX_REPLAYS = 3
#: The header a replayed message carries: the id of the chain's first dead letter.
REPLAY_HEADER = "Ratchet-Replay-Of"
_MAX_HEADERS, _MAX_HEADER_VALUE = 32, 1024  # an inbound message's headers, as kept
_ERROR_HEADERS = ("Ratchet-Error-Code", "Ratchet-Error", "Ratchet-Source-Subject")
_COLUMNS = ("id, subject, dlq_subject, tenant, error_code, error_message, details, headers,"
            " size, received_at, replay_of, replays")


@dataclass(frozen=True, slots=True)
class DeadLetterLimits:
    """How much the ``dead_letters`` table keeps (docs/operations.md, "Dead letters")."""

    max_rows: int = 10_000
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_bytes < 1:
            raise ValueError(f"dead-letter limits must be positive: {self.max_rows} letters,"
                             f" {self.max_bytes} bytes")


def kept_headers(headers: dict[str, str] | None) -> dict[str, str]:
    """An inbound message's headers as a dead letter keeps them: at most 32, each value cut
    to 1 KiB (they come from anyone who can publish)."""
    out: dict[str, str] = {}
    for name, value in list((headers or {}).items())[:_MAX_HEADERS]:
        out[str(name)[:128]] = str(value)[:_MAX_HEADER_VALUE]
    return out


def _republishable(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items()
            if not k.lower().startswith("nats-") and k not in _ERROR_HEADERS}


def record_dead_letter_txn(conn: sqlite3.Connection, *, subject: str, raw: bytes,
                           error: dict[str, Any], dlq_subject: str, now: float,
                           headers: dict[str, str] | None = None,
                           limits: DeadLetterLimits = DeadLetterLimits()) -> list[OutboxRow]:
    """Keep an unprocessable message with its error and headers, queue it for the DLQ
    stream, and trim the table to ``limits``."""
    original = kept_headers(headers)
    tenant = dlq_subject.rsplit(".", 1)[-1]
    replay_of = _chain_root(conn, original.get(REPLAY_HEADER), tenant)
    conn.execute(
        "INSERT INTO dead_letters(subject, dlq_subject, tenant, error_code, error_message,"
        " details, headers, raw, size, received_at, replay_of) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (subject, dlq_subject, tenant, error["code"], error["message"],
         msgpack.packb(error.get("details") or {}, use_bin_type=True),
         msgpack.packb(original), raw, len(raw), now, replay_of))
    _trim(conn, limits)
    sent = {**_republishable(original), "Ratchet-Error-Code": str(error["code"]),
            "Ratchet-Error": str(error["message"])[:512], "Ratchet-Source-Subject": subject}
    return [insert_outbox(conn, dlq_subject, new_id("dlq"), raw, now, sent)]


def _chain_root(conn: sqlite3.Connection, claimed: str | None, tenant: str) -> int | None:
    """The first letter of a replayed message's chain — only when it exists and is the same
    tenant's: the header is the publisher's to forge."""
    if claimed is None or not claimed.isdigit():
        return None
    row = conn.execute("SELECT COALESCE(replay_of, id) FROM dead_letters WHERE id = ?"
                       " AND tenant = ?", (int(claimed), tenant)).fetchone()
    return None if row is None else int(row[0])


def _trim(conn: sqlite3.Connection, limits: DeadLetterLimits) -> None:
    """Delete the oldest letters beyond ``limits`` (the newest is kept whatever its size).
    Sizes are read from the ``(id, size)`` index, never from the rows' raw messages: a
    letter costs well under a millisecond more with 10,000 kept."""
    newest = conn.execute("SELECT MAX(id) FROM dead_letters").fetchone()[0] or 0
    conn.execute("DELETE FROM dead_letters WHERE id <= ?", (newest - limits.max_rows,))
    excess = conn.execute("SELECT COALESCE(SUM(size), 0) FROM dead_letters"
                          ).fetchone()[0] - limits.max_bytes
    if excess <= 0:
        return
    cut, freed = 0, 0
    while freed < excess:  # read in pages: no statement left open under the DELETE
        page = conn.execute("SELECT id, size FROM dead_letters WHERE id > ? AND id < ?"
                            " ORDER BY id LIMIT 1024", (cut, newest)).fetchall()
        if not page:
            break
        for letter_id, size in page:
            cut, freed = letter_id, freed + size
            if freed >= excess:
                break
    conn.execute("DELETE FROM dead_letters WHERE id <= ?", (cut,))


@runtime_checkable
class DeadLetterStore(Protocol):
    """What ``admin dlq`` reads and does. ``tenant`` None: every tenant's letters."""

    async def dead_letter_subjects(self, tenant: str | None) -> list[dict[str, Any]]:
        """Per DLQ subject: how many letters, their bytes, the oldest and newest."""
        ...

    async def dead_letter_page(self, tenant: str | None, dlq_subject: str | None,
                               after_id: int, limit: int) -> list[dict[str, Any]]:
        """Letters after ``after_id``, oldest first, without their raw message."""
        ...

    async def dead_letter(self, tenant: str | None, letter_id: int) -> dict[str, Any] | None:
        """One letter with its raw message and headers."""
        ...

    async def replay_dead_letters(self, tenant: str | None, ids: list[int],
                                  now: float) -> list[dict[str, Any]]:
        """Republish each letter's message to its original subject (through the outbox);
        per id: ``replayed`` with the new message id, or why not."""
        ...

    async def purge_dead_letters(self, tenant: str | None, ids: list[int] | None,
                                 dlq_subject: str | None, before: float | None) -> int:
        """Delete letters (by id, or every one of a subject, or received before a time)."""
        ...


class DeadLetterRows(_StoreParts):
    """:class:`DeadLetterStore` on SQLite."""

    @staticmethod
    def _scope(tenant: str | None) -> tuple[str, list[Any]]:
        return ("TRUE", []) if tenant is None else ("tenant = ?", [tenant])

    async def dead_letter_subjects(self, tenant: str | None) -> list[dict[str, Any]]:
        where, args = self._scope(tenant)
        rows = await self._rows(
            "SELECT dlq_subject, COUNT(*), SUM(size), MIN(received_at), MAX(received_at)"
            f" FROM dead_letters WHERE {where} GROUP BY dlq_subject ORDER BY dlq_subject", args)
        return [{"dlq_subject": r[0], "count": r[1], "bytes": r[2], "oldest": r[3],
                 "newest": r[4]} for r in rows]

    async def dead_letter_page(self, tenant: str | None, dlq_subject: str | None,
                               after_id: int, limit: int) -> list[dict[str, Any]]:
        where, args = self._scope(tenant)
        if dlq_subject is not None:
            where, args = f"{where} AND dlq_subject = ?", [*args, dlq_subject]
        rows = await self._rows(f"SELECT {_COLUMNS} FROM dead_letters WHERE {where} AND id > ?"
                                " ORDER BY id LIMIT ?", [*args, after_id, limit])
        return [_letter(r) for r in rows]

    async def dead_letter(self, tenant: str | None, letter_id: int) -> dict[str, Any] | None:
        where, args = self._scope(tenant)
        row = await self._row(f"SELECT {_COLUMNS}, raw FROM dead_letters WHERE {where}"
                              " AND id = ?", [*args, letter_id])
        return None if row is None else {**_letter(row), "raw": bytes(row[12])}

    async def replay_dead_letters(self, tenant: str | None, ids: list[int],
                                  now: float) -> list[dict[str, Any]]:
        where, scope_args = self._scope(tenant)

        def txn(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], list[OutboxRow]]:
            results, outbox = [], []
            for letter_id in ids:
                row = conn.execute(
                    f"SELECT subject, headers, raw, COALESCE(replay_of, id) FROM dead_letters"
                    f" WHERE {where} AND id = ?", [*scope_args, letter_id]).fetchone()
                if row is None:
                    results.append({"id": letter_id, "outcome": "not found"})
                    continue
                root = conn.execute("SELECT replays FROM dead_letters WHERE id = ?",
                                    (row[3],)).fetchone()
                root_id = row[3] if root is not None else letter_id
                replays = root[0] if root is not None else 0
                if replays >= MAX_REPLAYS:
                    results.append({"id": letter_id, "outcome": f"refused: its message was"
                                    f" replayed {replays} times already (purge it, or fix"
                                    " the cause and publish it anew)"})
                    continue
                conn.execute("UPDATE dead_letters SET replays = replays + 1 WHERE id = ?",
                             (root_id,))
                headers = {**_republishable(_unpack(row[1]) or {}),
                           REPLAY_HEADER: str(root_id)}
                msg_id = new_id("replay")
                outbox.append(insert_outbox(conn, row[0], msg_id, bytes(row[2]), now, headers))
                results.append({"id": letter_id, "outcome": "replayed", "subject": row[0],
                                "message_id": msg_id, "replay": replays + 1})
            return results, outbox

        results, outbox = await self._writer.submit(txn)
        self._announce(outbox)
        return results

    async def purge_dead_letters(self, tenant: str | None, ids: list[int] | None,
                                 dlq_subject: str | None, before: float | None) -> int:
        where, args = self._scope(tenant)
        if ids is not None:
            where += f" AND id IN ({','.join('?' * len(ids))})"
            args = [*args, *ids]
        if dlq_subject is not None:
            where, args = f"{where} AND dlq_subject = ?", [*args, dlq_subject]
        if before is not None:
            where, args = f"{where} AND received_at < ?", [*args, before]

        def txn(conn: sqlite3.Connection) -> int:
            return conn.execute(f"DELETE FROM dead_letters WHERE {where}", args).rowcount

        removed: int = await self._writer.submit(txn)
        return removed


def _letter(r: Any) -> dict[str, Any]:
    return {"id": r[0], "subject": r[1], "dlq_subject": r[2], "tenant": r[3], "code": r[4],
            "message": r[5], "details": _unpack(r[6]), "headers": _unpack(r[7]) or {},
            "size": r[8], "received_at": r[9], "replay_of": r[10], "replays": r[11]}
