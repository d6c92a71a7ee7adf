"""A task's recorded history as plain data, for replay: read from the store's SQLite file
opened read-only, or from a file ``ratchet export`` wrote.

What a replay needs of the recording: the task row (workflow, version, input, times), its
checkpoints (``step_name`` = the node left, ``next_node``), the values each checkpoint wrote
(the state at every checkpoint is rebuilt from them, as ``Store.load_state`` does, but in
one pass over the rows instead of one query per checkpoint), the blobs they reference, the
action ledger's rows (writes and model calls, with request hashes and results), the reads'
answers (``action.read`` events, actors/task/read_record.py) and the agent log.

Rows are kept as the store wrote them — msgpack bytes, secrets sealed — and decoded only
when replayed, with the store's :class:`~protocol.secrets.Sealer` if the key is at hand: an
export therefore carries every secret sealed, never in the clear.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from ratchet.persistence.checkpoints import decode_optional
from ratchet.persistence.ledger import ACTION_COLUMNS, ActionRecord, action_record
from ratchet.persistence.records import TaskRecord
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import NotFound
from ratchet.protocol.secrets import SEALED_CODES, Sealer

__all__ = ["Checkpoint", "Recording", "export_tasks", "open_read_only", "read_recordings",
           "read_task", "select_tasks", "write_recordings"]

_TASK_COLUMNS = ("task_id, tenant, workflow, workflow_version, status, version, input,"
                 " next_step, steps_total, last_checkpoint, last_event_seq, deadline_at,"
                 " created_at, updated_at, error, output, step_failures, current_node, visits,"
                 " budget, spent, control, traceparent, idempotency_key, definition_hash")
#: What an export file starts with: its kind and format version.
EXPORT_HEADER = {"kind": "ratchet.recordings", "format": 1}


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One recorded node move: checkpoint ``seq`` left ``step_name`` for ``next_node``."""

    seq: int
    step_index: int
    step_name: str
    next_node: str | None
    created_at: float


@dataclass(slots=True)
class Recording:
    """One task's recorded history, rows as stored (see the module doc)."""

    task: list[Any]  # the tasks row, in _TASK_COLUMNS order
    checkpoints: list[Checkpoint]
    values: list[tuple[str, int, bytes | None, str | None, int]]  # key, seq, inline, blob, deleted
    blobs: dict[str, bytes]
    actions: list[list[Any]]  # ledger rows, in ACTION_COLUMNS order
    reads: list[dict[str, Any]]  # action.read payloads, in order
    agent_log: list[tuple[str, int, str, bytes]]  # node scope, seq, kind, body
    started_at: float | None = None  # when it was first dispatched

    @property
    def task_id(self) -> str:
        return str(self.task[0])

    def record(self, sealer: Sealer) -> TaskRecord:
        """The task row as a :class:`TaskRecord` (its input's secrets opened, if they can be)."""
        r = self.task
        unpack = _lenient(sealer)
        return TaskRecord(
            task_id=r[0], tenant=r[1], workflow=r[2], workflow_version=r[3], status=r[4],
            version=r[5], input=dict(unpack(r[6]) or {}), next_step=r[7], steps_total=r[8],
            last_checkpoint=r[9], last_event_seq=r[10], deadline_at=r[11], created_at=r[12],
            updated_at=r[13], error=decode_optional(r[14]), output=decode_optional(r[15]),
            step_failures=r[16], current_node=r[17], visits=dict(decode_optional(r[18]) or {}),
            budget=dict(decode_optional(r[19]) or {}), spent=dict(decode_optional(r[20]) or {}),
            control=dict(decode_optional(r[21]) or {}), traceparent=r[22],
            idempotency_key=r[23] or "", definition_hash=r[24])

    def ledger(self, sealer: Sealer) -> list[ActionRecord]:
        unpack = _lenient(sealer)
        return [action_record(row, lambda b: None if b is None else unpack(b))
                for row in self.actions]

    def agent_entries(self, sealer: Sealer, scope: str) -> list[tuple[str, dict[str, Any]]]:
        """The agent log of one node visit (``node#visit``), bodies decoded."""
        unpack = _lenient(sealer)
        return [(kind, dict(unpack(body))) for node, _, kind, body in self.agent_log
                if node == scope]

    def states(self, sealer: Sealer) -> Iterator[dict[str, Any]]:
        """The state at checkpoint 0 (before the first node), 1, ..., n, each a new dict."""
        unpack = _lenient(sealer)
        by_seq: dict[int, list[tuple[str, bytes | None, str | None, int]]] = {}
        for key, seq, inline, blob, deleted in self.values:
            by_seq.setdefault(seq, []).append((key, inline, blob, deleted))
        state: dict[str, Any] = {}
        yield {k: v for k, v in state.items()}
        for cp in self.checkpoints:
            for key, inline, blob, deleted in by_seq.get(cp.seq, ()):
                if deleted:
                    state.pop(key, None)
                elif blob is not None:
                    data = self.blobs.get(blob)
                    if data is None:
                        raise NotFound("checkpoint references a missing blob",
                                       task_id=self.task_id, blob=blob)
                    state[key] = unpack(data)
                else:
                    state[key] = unpack(inline or b"\xc0")
            yield dict(state)

    def to_wire(self) -> dict[str, Any]:
        return {"task": self.task, "checkpoints": [list(_cp(c)) for c in self.checkpoints],
                "values": [list(v) for v in self.values], "blobs": self.blobs,
                "actions": self.actions, "reads": self.reads,
                "agent_log": [list(a) for a in self.agent_log], "started_at": self.started_at}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Recording:
        return cls(task=list(data["task"]),
                   checkpoints=[Checkpoint(*c) for c in data["checkpoints"]],
                   values=[tuple(v) for v in data["values"]],
                   blobs=dict(data["blobs"]), actions=[list(a) for a in data["actions"]],
                   reads=list(data["reads"]),
                   agent_log=[tuple(a) for a in data["agent_log"]],
                   started_at=data.get("started_at"))


def _cp(c: Checkpoint) -> tuple[Any, ...]:
    return (c.seq, c.step_index, c.step_name, c.next_node, c.created_at)


def _lenient(sealer: Sealer) -> Any:
    """msgpack decoding that opens secrets the sealer can open and leaves the others sealed
    (an ``ExtType``): a replay without the key still runs the steps that never open them."""

    def hook(code: int, data: bytes) -> Any:
        if code in SEALED_CODES and sealer.key_id is not None and data[1:5].hex() == sealer.key_id:
            return sealer.ext_hook(code, data)
        return msgpack.ExtType(code, data)

    def unpack(data: bytes | bytearray) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=hook)

    return unpack


# -- reading the store, read-only ----------------------------------------------------------

def open_read_only(path: str | Path) -> sqlite3.Connection:
    """The store's SQLite file opened read-only (``mode=ro``): a replay cannot write to it
    whatever it runs. Raises NotFound when there is no such file."""
    p = Path(path)
    if not p.is_file():
        raise NotFound("no store at this path", path=str(p))
    # A store in WAL mode gets its -wal and -shm files made by any reader, read-only too;
    # with none there (no node has the file open) it is read as immutable: nothing at all
    # is created or changed beside it.
    idle = not p.with_name(p.name + "-wal").exists()
    conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro{'&immutable=1' if idle else ''}",
                           uri=True)
    conn.execute("PRAGMA query_only = ON")  # belt and braces: refuse writes in SQL too
    return conn


def read_task(conn: sqlite3.Connection, task_id: str) -> Recording:
    """One task's recording. Raises NotFound."""
    row = conn.execute(f"SELECT {_TASK_COLUMNS} FROM tasks WHERE task_id = ?",
                       (task_id,)).fetchone()
    if row is None:
        raise NotFound("no such task", task_id=task_id)
    checkpoints = [Checkpoint(*r) for r in conn.execute(
        "SELECT seq, step_index, step_name, next_node, created_at FROM checkpoints"
        " WHERE task_id = ? ORDER BY seq", (task_id,))]
    values = [tuple(r) for r in conn.execute(
        "SELECT key, seq, inline, blob, deleted FROM checkpoint_values WHERE task_id = ?"
        " ORDER BY seq", (task_id,))]
    digests = sorted({v[3] for v in values if v[3] is not None})
    reads: list[dict[str, Any]] = []
    started: float | None = None
    for etype, at, payload in conn.execute(
            "SELECT type, occurred_at, payload FROM events WHERE task_id = ? AND type IN (?, ?)"
            " ORDER BY sequence", (task_id, EventType.ACTION_READ, EventType.TASK_STARTED)):
        if etype == EventType.ACTION_READ:
            reads.append(dict(decode_optional(payload) or {}))
        elif started is None:
            started = float(at)
    return Recording(
        task=list(row), checkpoints=checkpoints, values=values,
        blobs={d: _blob(conn, d) for d in digests},
        actions=[list(r) for r in conn.execute(
            f"SELECT {ACTION_COLUMNS} FROM actions WHERE task_id = ? ORDER BY seq", (task_id,))],
        reads=reads,
        agent_log=[tuple(r) for r in conn.execute(
            "SELECT node, seq, kind, body FROM agent_log WHERE task_id = ? ORDER BY node, seq",
            (task_id,))],
        started_at=started)


def _blob(conn: sqlite3.Connection, digest: str) -> bytes:
    row = conn.execute("SELECT data, chunks FROM blobs WHERE digest = ?", (digest,)).fetchone()
    if row is None:
        return b""
    if not row[1]:
        return bytes(row[0])
    return b"".join(bytes(r[0]) for r in conn.execute(  # a blob over 1 MiB: its chunks
        "SELECT data FROM blob_chunks WHERE digest = ? ORDER BY idx", (digest,)))


def select_tasks(conn: sqlite3.Connection, *, workflow: str | None = None,
                 status: str | None = None, since: float | None = None,
                 tenant: str | None = None, limit: int = 10_000) -> list[str]:
    """Ids of the tasks matching every filter given, oldest first."""
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("workflow", workflow), ("status", status), ("tenant", tenant)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if since is not None:
        where.append("created_at >= ?")
        args.append(since)
    sql = "SELECT task_id FROM tasks" + (" WHERE " + " AND ".join(where) if where else "")
    return [r[0] for r in conn.execute(sql + " ORDER BY created_at LIMIT ?", (*args, limit))]


# -- export files --------------------------------------------------------------------------

def write_recordings(path: str | Path, recordings: Iterable[Recording]) -> int:
    """Write an export file (a msgpack stream: a header, then one recording each); returns
    how many recordings it holds."""
    count = 0
    with open(path, "wb") as out:
        packer = msgpack.Packer(use_bin_type=True)
        out.write(packer.pack(EXPORT_HEADER))
        for rec in recordings:
            out.write(packer.pack(rec.to_wire()))
            count += 1
    return count


def export_tasks(store: str | Path, out: str | Path, *, task_ids: list[str] | None = None,
                 **filters: Any) -> int:
    """Write the recorded tasks ``task_ids`` (else those :func:`select_tasks` finds with
    ``filters``) of the store file ``store`` to the export file ``out``; how many."""
    conn = open_read_only(store)
    try:
        ids = task_ids or select_tasks(conn, **filters)
        return write_recordings(out, (read_task(conn, t) for t in ids))
    finally:
        conn.close()


def read_recordings(path: str | Path) -> Iterator[Recording]:
    """The recordings of an export file. Raises ValueError when it is not one."""
    with open(path, "rb") as f:
        unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False,
                                    max_buffer_size=1 << 31)
        header = next(unpacker, None)
        if not isinstance(header, dict) or header.get("kind") != EXPORT_HEADER["kind"]:
            raise ValueError(f"{path} is not a file `ratchet export` wrote")
        for item in unpacker:
            yield Recording.from_wire(item)
