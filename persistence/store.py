"""The Store: the truth of every task. Writes go through the group-commit writer; reads
use an aiosqlite connection (WAL lets them run beside the writer)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from ratchet.persistence.admin_rows import append_audit_txn
from ratchet.persistence.audit_heads import HeadWriter
from ratchet.persistence.audit_seal import AuditHead, AuditSeal
from ratchet.persistence.blobs import read_blob
from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.connection import open_connection
from ratchet.persistence.dead_letter_rows import (
    DeadLetterLimits,
    DeadLetterRows,
    record_dead_letter_txn,
)
from ratchet.persistence.diagnose_rows import DiagnoseRows
from ratchet.persistence.drift_rows import DriftRows
from ratchet.persistence.file_watch import put_back
from ratchet.persistence.keyring import KeyringRows
from ratchet.persistence.leases import (
    HostLeaseClock,
    LeaseClock,
    LeaseRows,
    check_fences,
    sync_lease_epoch_txn,
)
from ratchet.persistence.ledger import ActionRecord, action_record
from ratchet.persistence.metric_rows import MetricRows
from ratchet.persistence.migrations import migrate
from ratchet.persistence.pipelined import PipelinedWriter, apply_pipelined
from ratchet.persistence.records import Fence, LoadedState, TaskRecord, fence_keys
from ratchet.persistence.schedule_rows import ScheduleRows
from ratchet.persistence.settle_rows import SettleRows
from ratchet.persistence.store_rows import AdminRows, RowReads
from ratchet.persistence.sweep_rows import SweepRows
from ratchet.persistence.task_record import TASK_COLUMNS, task_record
from ratchet.persistence.txns import (
    AcceptResult,
    ChangeResult,
    NewTask,
    OutboxRow,
    TaskChange,
    accept_submission_txn,
    apply_change_txn,
    delete_outbox_txn,
)
from ratchet.persistence.version_rows import VersionRows
from ratchet.persistence.wal import DEFAULT_WAL_LIMIT, WalStats
from ratchet.persistence.writer import LoopWriter, WriterStats, make_writer
from ratchet.protocol.errors import Fenced, NotFound
from ratchet.protocol.messages import TaskSnapshot
from ratchet.protocol.secrets import Sealer
from ratchet.protocol.states import TERMINAL

__all__ = ["Store", "TaskRecord", "LoadedState", "ActionRecord", "action_record"]

OutboxListener = Callable[[list[OutboxRow]], None]
T = TypeVar("T")


class Store(RowReads, AdminRows, LeaseRows, KeyringRows, ScheduleRows, DriftRows,
            SweepRows, SettleRows, MetricRows, DiagnoseRows, DeadLetterRows, VersionRows):
    """Open with :meth:`open`; close with :meth:`close` (idempotent).

    Args:
        path: the SQLite file (created, and migrated, if needed).
        synchronous: ``FULL`` (default: a commit is on disk before anything depends on it)
            or ``NORMAL`` (no sync per commit: an OS crash may lose the last commits).
        writer: ``auto``, ``loop`` or ``thread`` (see persistence/writer.py).
        wal_limit: bytes of WAL at which writers hold while it is reset (persistence/wal.py).
        lease_clock: the store's time for lease expiry (default: the host's boot time).
        audit_seal: the audit chain's key and head (audit_seal.py); None: unkeyed, proves nothing.
    """

    def __init__(self, path: str | Path, synchronous: str = "FULL",
                 writer: str = "auto", wal_limit: int = DEFAULT_WAL_LIMIT,
                 fence: Fence | None = None, lease_clock: LeaseClock | None = None,
                 audit_seal: AuditSeal | None = None) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError("synchronous must be NORMAL or FULL")
        self.path = str(path)
        self.synchronous = synchronous
        #: How much the dead_letters table keeps (persistence/dead_letter_rows.py).
        self.dead_letter_limits = DeadLetterLimits()
        self._writer = make_writer(self.path, synchronous, writer, wal_limit)
        #: The writer that may hand a commit back before it is durable (FULL on the loop).
        self._syncing: PipelinedWriter | None = (
            self._writer if isinstance(self._writer, LoopWriter) else None)
        self._reader: aiosqlite.Connection | None = None
        self._outbox_listeners: list[OutboxListener] = []
        self._closed = False
        self._rescued_to: str | None = None  # file_watch.put_back, at close
        #: A node's held leases: task-execution writes then carry its fencing token (None:
        #: a store used without leases, e.g. by tools and tests, checks nothing).
        self.fence: Fence | None = fence
        self.lease_clock: LeaseClock = lease_clock or HostLeaseClock()
        self.audit_seal = audit_seal
        self._heads = HeadWriter(audit_seal)
        #: Seals the secrets of task inputs, state values, ledger rows and tool sessions
        #: (protocol/secrets.py); without a key (:meth:`use_secrets`) none can be stored.
        self.secrets = Sealer()

    @classmethod
    async def open(cls, path: str | Path, synchronous: str = "FULL",
                   writer: str = "auto", wal_limit: int = DEFAULT_WAL_LIMIT,
                   fence: Fence | None = None, lease_clock: LeaseClock | None = None,
                   audit_seal: AuditSeal | None = None) -> Store:
        store = cls(path, synchronous, writer, wal_limit, fence, lease_clock, audit_seal)
        await store._open()
        return store

    async def _open(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)

        def _migrate() -> None:
            conn = open_connection(self.path, self.synchronous)
            try:
                migrate(conn)
                conn.execute("BEGIN IMMEDIATE")
                try:
                    sync_lease_epoch_txn(conn, self.lease_clock.epoch())
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                self._anchor_audit(conn)
            finally:
                conn.close()

        await asyncio.to_thread(_migrate)
        self._writer.start()
        self._reader = await aiosqlite.connect(self.path, isolation_level=None)
        await self._reader.execute("PRAGMA busy_timeout=30000")

    def _anchor_audit(self, conn: sqlite3.Connection) -> None:
        """On a fresh seal, anchor the entries written before it (unkeyed) under the head:
        from now on rewriting them shows, as rewriting keyed ones does."""
        if self.audit_seal is None or not self.audit_seal.fresh:
            return
        last = conn.execute("SELECT seq, hash, (SELECT COUNT(*) FROM audit) FROM audit"
                            " ORDER BY seq DESC LIMIT 1").fetchone()
        if last is not None:
            self.audit_seal.anchor(AuditHead(last[0], last[1], last[2]))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._heads.flush()
        if self._reader is not None:
            await self._reader.close()
        await self._writer.close()
        if self._writer.rescued is not None:  # the file was lost under us: put the data back
            self._rescued_to = await asyncio.to_thread(put_back, self._writer.rescued, self.path)

    @property
    def rescued_to(self) -> str | None:
        """Where the data of a lost database file went when the store closed."""
        return self._rescued_to

    @property
    def file_lost(self) -> str | None:
        """Why the database file is no longer at its path, once noticed (file_watch.py);
        from then on every write is refused with ``StoreFileLost``."""
        return self._writer.wal.lost

    def on_file_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` on this event loop when the database file is lost."""
        loop = asyncio.get_running_loop()

        def notify(reason: str) -> None:  # on the WAL guard's thread
            try:
                loop.call_soon_threadsafe(callback, reason)
            except RuntimeError:  # the loop closed meanwhile: nobody left to tell
                pass

        self._writer.wal.on_lost.append(notify)

    @property
    def writer_stats(self) -> WriterStats:
        return self._writer.stats

    @property
    def wal_stats(self) -> WalStats:
        """The WAL's size, peak, checkpoints and writer holds (see persistence/wal.py)."""
        return self._writer.wal.stats

    def add_outbox_listener(self, listener: OutboxListener) -> None:
        """Called on the loop with the outbox rows of every commit that made some."""
        self._outbox_listeners.append(listener)

    def remove_outbox_listener(self, listener: OutboxListener) -> None:
        if listener in self._outbox_listeners:
            self._outbox_listeners.remove(listener)

    def add_outbox_resync(self, callback: Callable[[], None]) -> None:
        """Never called here (after a failed WAL sync the writer refuses every write);
        PostgresStore's: when a commit's durability is unknown (postgres/syncer.py)."""

    def _announce(self, rows: list[OutboxRow]) -> None:
        if rows:
            for listener in self._outbox_listeners:
                listener(rows)

    # -- writes ----------------------------------------------------------------------

    def _fenced(self, task_id: str, fn: Callable[[sqlite3.Connection], T]
                ) -> Callable[[sqlite3.Connection], T]:
        """``fn`` preceded, in its own transaction, by the check of this node's fencing token
        for the task's partition (the write is refused if a newer owner exists); for the
        partitions of the branches that make it, when they do (``fence_scope``)."""
        if self.fence is None:
            return fn
        # Fenced: not held locally.
        held = {self.fence.token_for(key) for key in fence_keys(task_id)}

        def txn(conn: sqlite3.Connection) -> T:
            try:
                check_fences(conn, held, self.lease_clock.now())
            except Fenced:
                self.fenced_refused += 1  # a metric (persistence/metric_rows.py)
                raise
            return fn(conn)

        return txn

    async def run_txn(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run a ``*_txn`` function in the next group commit."""
        return await self._writer.submit(fn)

    async def accept_submission(self, task: NewTask) -> AcceptResult:
        result: AcceptResult = await self._writer.submit(lambda c: accept_submission_txn(c, task))
        self._announce(result.outbox)
        return result

    async def apply(self, change: TaskChange) -> ChangeResult:
        """Apply one task change atomically (see :func:`apply_change_txn` for raises), with
        its audit entry, if it has one, in the same transaction."""
        def txn(conn: sqlite3.Connection) -> tuple[ChangeResult, AuditHead | None]:
            result = apply_change_txn(conn, change)
            audit = change.audit
            return result, (append_audit_txn(conn, audit, self.audit_seal) if audit else None)

        if change.pipelined and self._syncing is not None and change.audit is None:
            # The caller goes on at the commit; its events leave once it is durable.
            return await apply_pipelined(self._syncing, self._fenced(change.task_id, txn),
                                         self._announce)
        result, head = await self._writer.submit(self._fenced(change.task_id, txn))
        self._announce(result.outbox)
        if head is not None:
            await self._advance_head(head)
        return result

    async def record_dead_letter(
        self, *, subject: str, raw: bytes, error: dict[str, Any], dlq_subject: str, now: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        rows: list[OutboxRow] = await self._writer.submit(
            lambda c: record_dead_letter_txn(
                c, subject=subject, raw=raw, error=error, dlq_subject=dlq_subject, now=now,
                headers=headers, limits=self.dead_letter_limits,
            )
        )
        self._announce(rows)

    async def delete_outbox(self, ids: list[int]) -> None:
        await self._writer.submit(lambda c: delete_outbox_txn(c, ids))

    # -- reads -----------------------------------------------------------------------

    async def _rows(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[Any]:
        """Every row of one read, executed and read to its end in a single call.

        Why: a statement left active holds the connection's read transaction open, so every
        other read on it sees that old snapshot — stale for seconds under load
        (``test_a_read_sees_every_commit_made_before_it_began_even_under_load``). A lock
        around each read did it too, but halved concurrent throughput."""
        assert self._reader is not None, "Store.open() first"
        gate = self._writer.wal.reads_open
        if not gate.is_set():  # the WAL is being reset: milliseconds (persistence/wal.py)
            await asyncio.to_thread(gate.wait, 5.0)
        rows = list(await self._reader.execute_fetchall(sql, args))
        if self._syncing is not None:  # nothing read is told before it is durable
            await self._syncing.synced()
        return rows

    async def _row(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        """The first row of one read (see :meth:`_rows`), or None."""
        rows = await self._rows(sql, args)
        return rows[0] if rows else None

    async def load_task(self, task_id: str) -> TaskRecord:
        row = await self._row(
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = ?", (task_id,)
        )
        if row is None:
            raise NotFound("no such task", task_id=task_id)
        return task_record(tuple(row), self.secrets)

    async def snapshot(self, tenant: str, task_id: str) -> TaskSnapshot:
        """The task as ``status`` shows it. A task of another tenant is NOT_FOUND."""
        rec = await self.load_task(task_id)
        if rec.tenant != tenant:
            raise NotFound("no such task", task_id=task_id)
        return TaskSnapshot(
            task_id=rec.task_id, tenant=rec.tenant, workflow=rec.workflow,
            workflow_version=rec.workflow_version, status=rec.status, version=rec.version,
            next_step=rec.next_step, steps_total=rec.steps_total,
            last_checkpoint=rec.last_checkpoint, last_event_sequence=rec.last_event_seq,
            error=rec.error, output=rec.output, created_at=rec.created_at,
            updated_at=rec.updated_at, sandbox=rec.sandbox,
        )

    async def load_state(self, task_id: str, checkpoint: int | None = None) -> LoadedState:
        """The state at ``checkpoint`` (default: the latest), rebuilt from the deltas."""
        upto = checkpoint if checkpoint is not None else 2**62
        rows = await self._rows(
            "SELECT v.key, v.inline, v.blob, v.deleted FROM checkpoint_values v"
            " JOIN (SELECT key, MAX(seq) AS seq FROM checkpoint_values"
            "       WHERE task_id = ? AND seq <= ? GROUP BY key) last"
            " ON v.key = last.key AND v.seq = last.seq WHERE v.task_id = ?",
            (task_id, upto, task_id),
        )
        encoded: dict[str, bytes] = {}
        blob_refs: dict[str, str] = {}
        for key, inline, blob, deleted in rows:
            if deleted:
                continue
            if blob is not None:
                blob_refs[key] = blob
            else:
                encoded[key] = inline
        values = {k: self.secrets.unpack(v) for k, v in encoded.items()}
        for key, digest in blob_refs.items():  # one at a time: its encoding, then its value
            data = await read_blob(self._row, digest)
            if data is None:
                raise NotFound("checkpoint references a missing blob", task_id=task_id, blob=digest)
            values[key] = self.secrets.unpack(data)
            del data
        return LoadedState(values, encoded, blob_refs)

    async def active_tasks(self) -> list[tuple[str, str, str]]:
        """(task_id, tenant, status) of every task not in a terminal state."""
        terminal = tuple(s.value for s in TERMINAL)
        rows = await self._rows(
            "SELECT task_id, tenant, status FROM tasks WHERE status NOT IN (?,?,?)"
            " ORDER BY created_at",
            terminal,
        )
        return [(r[0], r[1], r[2]) for r in rows]

    async def pending_outbox(self, limit: int = 1000, after_id: int = 0) -> list[OutboxRow]:
        rows = await self._rows(
            "SELECT id, subject, msg_id, payload, headers FROM outbox WHERE id > ?"
            " ORDER BY id LIMIT ?",
            (after_id, limit),
        )
        return [OutboxRow(r[0], r[1], r[2], r[3], _unpack(r[4])) for r in rows]

    async def events(self, task_id: str, after: int = 0) -> list[dict[str, Any]]:
        rows = await self._rows(
            "SELECT sequence, event_id, type, aggregate_version, occurred_at, payload"
            " FROM events WHERE task_id = ? AND sequence > ? ORDER BY sequence",
            (task_id, after),
        )
        return [
            {"sequence": r[0], "event_id": r[1], "type": r[2], "aggregate_version": r[3],
             "occurred_at": r[4], "payload": _unpack(r[5])}
            for r in rows
        ]

    async def count(self, table: str) -> int:
        """Row count of one table (tests and operations)."""
        if not table.isidentifier():
            raise ValueError(table)
        row = await self._row(f"SELECT COUNT(*) FROM {table}")
        return int(row[0]) if row else 0

    async def dead_letters(self) -> list[dict[str, Any]]:
        rows = await self._rows(
            "SELECT id, subject, error_code, error_message, details, received_at FROM dead_letters"
            " ORDER BY id"
        )
        return [
            {"id": r[0], "subject": r[1], "code": r[2], "message": r[3],
             "details": _unpack(r[4]), "received_at": r[5]}
            for r in rows
        ]
