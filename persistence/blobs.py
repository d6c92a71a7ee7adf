"""The blob store: state values too large for their checkpoint row, once per digest.

A blob up to :data:`CHUNK_BYTES` is one ``blobs`` row holding its data. A larger one is a
``blobs`` row with empty ``data`` and its ``chunks`` count, and that many ``blob_chunks``
rows of :data:`CHUNK_BYTES` (the last one shorter), written from the encoding's buffer
slice by slice. Why chunks: SQLite copies a bound value, and copies it again into the
record it builds, so one 15 MiB row costs two 15 MiB copies while it is written; 1 MiB
rows cost two 1 MiB copies each, one after another. (Incremental blob I/O,
``sqlite3_blob_write`` into a ``zeroblob``, would avoid them too, but writes every page
twice — the zeros, then the data — and needs a rowid table, so a rebuild of ``blobs``.)

Reading puts the chunks back into one buffer of the blob's size: a value loaded from the
store costs its encoding and the decoded value, never a second encoding.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ratchet.persistence.checkpoints import Encoded

__all__ = ["CHUNK_BYTES", "write_blobs", "read_blob"]

#: The largest blob kept in one row, and the size of a larger one's chunks.
CHUNK_BYTES = 1024 * 1024

#: One read of the store: ``(sql, args) -> first row or None``.
RowReader = Callable[[str, tuple[Any, ...]], Awaitable[Any]]


def write_blobs(conn: sqlite3.Connection, blobs: Mapping[str, Encoded], now: float) -> None:
    """Store each blob not stored yet (inside the caller's transaction, as a
    ``*_txn``)."""
    for digest, data in blobs.items():
        view = memoryview(data)
        size = view.nbytes
        if size <= CHUNK_BYTES:
            conn.execute("INSERT OR IGNORE INTO blobs(digest, size, data, created_at)"
                         " VALUES (?,?,?,?)", (digest, size, view, now))
            continue
        chunks = -(-size // CHUNK_BYTES)
        cur = conn.execute("INSERT OR IGNORE INTO blobs(digest, size, data, chunks, created_at)"
                           " VALUES (?,?,x'',?,?)", (digest, size, chunks, now))
        if cur.rowcount != 1:
            continue  # stored already, by another task or an earlier checkpoint
        for index in range(chunks):
            conn.execute("INSERT INTO blob_chunks(digest, idx, data) VALUES (?,?,?)",
                         (digest, index, view[index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES]))


async def read_blob(row: RowReader, digest: str) -> bytes | bytearray | None:
    """The blob's bytes, or None when it (or one of its chunks) is missing."""
    head = await row("SELECT size, chunks, data FROM blobs WHERE digest = ?", (digest,))
    if head is None:
        return None
    size, chunks, data = head
    if not chunks:
        return bytes(data)
    whole = bytearray(size)
    offset = 0
    for index in range(chunks):
        part = await row("SELECT data FROM blob_chunks WHERE digest = ? AND idx = ?",
                         (digest, index))
        if part is None or offset + len(part[0]) > size:
            return None
        whole[offset:offset + len(part[0])] = part[0]
        offset += len(part[0])
    return whole if offset == size else None
