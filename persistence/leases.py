"""Partition leases with fencing tokens, and the node registry, as store transactions.

A lease row per partition: ``owner``, ``token`` and ``expires_at``. The token only ever
increases: it is bumped each time a partition changes hands (or is taken again after it
expired), never on renewal. Every write that comes from task execution names the
partition and the token its node holds; :func:`check_fence` runs inside that write's
transaction and refuses it unless the token is still the partition's current one and the
lease has not expired. So a node paused past its lease (a GC pause, SIGSTOP) that wakes up
can never commit, whatever it still believes: the check is in the store, not in memory.

Lease times — ``expires_at``, a node's ``seen_at`` — are the **store's** time, never a
node's wall clock: each lease transaction reads the store's :class:`LeaseClock` inside the
transaction, so that no node's clock, stepped or wrong, decides whether another node's
lease has run out. For SQLite (every node on one host, one file) that is the host's
``CLOCK_BOOTTIME``: one clock for every process of the host, which no ``date -s`` or NTP
step moves. Readings count from the boot (``epoch``, the kernel's boot id): a store opened
after a reboot voids every lease time of the previous boot (tokens are kept). A
PostgreSQL store reads its server's ``clock_timestamp()`` behind the same port; callers
never pass a time for lease expiry.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgpack

from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.store_rows import _StoreParts
from ratchet.protocol.errors import Fenced, PartitionCountMismatch

__all__ = [
    "HostLeaseClock",
    "LeaseClock",
    "LeaseRow",
    "LeaseRows",
    "NodeRow",
    "acquire_txn",
    "check_fence",
    "check_fences",
    "ensure_partitions_txn",
    "heartbeat_txn",
    "release_txn",
    "renew_txn",
    "set_node_status_txn",
    "SteadyLeaseClock",
    "sync_lease_epoch_txn",
]


class LeaseClock(Protocol):
    """The store's time for lease expiry and node liveness."""

    def epoch(self) -> str:
        """What readings count from; readings of another epoch mean nothing."""
        ...

    def now(self) -> float:
        """Seconds, on a clock shared by every node of the store that no step moves."""
        ...


def _uptime() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class HostLeaseClock:
    """This host's boot time (``CLOCK_BOOTTIME``: it goes on during a suspend), counted from
    its boot. A process whose clock calls are faked (``LD_PRELOAD`` libfaketime without
    ``FAKETIME_DONT_FAKE_MONOTONIC``) would disagree with the others: when the boot time it
    reads is not the kernel's ``/proc/uptime``, that file is read instead."""

    def __init__(self) -> None:
        uptime = _uptime()
        self._faked = uptime is not None and abs(self._boottime() - uptime) > 1.0

    @staticmethod
    def _boottime() -> float:
        if hasattr(time, "CLOCK_BOOTTIME"):
            return time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.monotonic()

    def epoch(self) -> str:
        try:
            return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:  # not Linux: monotonic time, of an unknown boot
            return "unknown"

    def now(self) -> float:
        if self._faked:
            return _uptime() or self._boottime()
        return self._boottime()


class SteadyLeaseClock:
    """A lease clock read from a function (tests: a fake clock's monotonic time)."""

    def __init__(self, read: Callable[[], float], epoch: str = "steady") -> None:
        self._read = read
        self._epoch = epoch

    def epoch(self) -> str:
        return self._epoch

    def now(self) -> float:
        return self._read()


@dataclass(frozen=True, slots=True)
class LeaseRow:
    partition: int
    owner: str | None
    token: int
    expires_at: float
    previous_owner: str | None
    #: Taken from an owner that never released it — it died or froze (or, taken back by a
    #: restarted node, its own previous incarnation crashed) — rather than handed over.
    reaped: bool = False
    #: Seconds the lease had left when read, by the store's time (<= 0: expired).
    ttl_left: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    status: str  # active | draining | stopped
    heartbeat_at: float
    started_at: float
    info: dict[str, Any]
    #: Seconds since its last heartbeat, by the store's time (liveness; heartbeat_at and
    #: started_at are the node's wall clock, for people).
    age: float = 0.0


def ensure_partitions_txn(conn: sqlite3.Connection, partitions: int) -> None:
    """Create the lease rows once; refuse a node configured for another partition count
    (tasks would hash to other partitions and two nodes could run one task)."""
    existing = conn.execute("SELECT COUNT(*) FROM leases").fetchone()[0]
    if existing and existing != partitions:
        raise PartitionCountMismatch(
            f"the store has {existing} partitions; this node was started with {partitions}",
            store=existing, node=partitions)
    if not existing:
        conn.executemany("INSERT INTO leases(partition, owner, token, expires_at) VALUES"
                         " (?, NULL, 0, 0)", [(p,) for p in range(partitions)])


def sync_lease_epoch_txn(conn: sqlite3.Connection, epoch: str) -> None:
    """At open: if the lease times were written in another epoch (before a reboot), void
    them — every lease expired, every node unseen — and record this epoch."""
    row = conn.execute("SELECT epoch FROM lease_epoch WHERE id = 0").fetchone()
    if row is not None and row[0] == epoch:
        return
    conn.execute("UPDATE leases SET expires_at = 0")
    conn.execute("UPDATE nodes SET seen_at = 0")
    conn.execute("INSERT INTO lease_epoch(id, epoch) VALUES (0, ?) ON CONFLICT(id) DO UPDATE"
                 " SET epoch = excluded.epoch", (epoch,))


def check_fence(conn: sqlite3.Connection, partition: int, token: int, now: float) -> None:
    """Raise :class:`Fenced` unless ``token`` is the partition's current, unexpired token."""
    row = conn.execute("SELECT owner, token, expires_at FROM leases WHERE partition = ?",
                       (partition,)).fetchone()
    if row is None or row[1] != token or row[2] <= now:
        raise Fenced("write refused: this node's lease on the partition is gone",
                     partition=partition, token=token,
                     current_token=row[1] if row else None, owner=row[0] if row else None)


def check_fences(conn: sqlite3.Connection, held: set[tuple[int, int]], now: float) -> None:
    """:func:`check_fence` for several partitions at once (a group of branches of several
    partitions), with one read of the lease table."""
    if len(held) == 1:
        (partition, token), = held
        check_fence(conn, partition, token, now)
        return
    rows = {p: (o, t, e) for p, o, t, e in conn.execute(
        "SELECT partition, owner, token, expires_at FROM leases")}
    for partition, token in held:
        row = rows.get(partition)
        if row is None or row[1] != token or row[2] <= now:
            raise Fenced("write refused: this node's lease on the partition is gone",
                         partition=partition, token=token,
                         current_token=row[1] if row else None,
                         owner=row[0] if row else None)


def acquire_txn(conn: sqlite3.Connection, partition: int, node: str, now: float,
                ttl: float, reclaim: bool = False) -> LeaseRow | None:
    """Take the partition if it is free or its lease expired; the new token, or None.

    ``reclaim``: a node starting under its id takes back the leases its previous (dead)
    incarnation held without waiting for them to expire — with a new token, so anything
    that incarnation might still write is refused."""
    row = conn.execute("SELECT owner, token, expires_at, previous_owner FROM leases"
                       " WHERE partition = ?", (partition,)).fetchone()
    if row is None:
        return None
    owner, token, expires_at, released_by = row
    if owner is not None and expires_at > now and not (reclaim and owner == node):
        return None  # held (by us: renewal is renew_txn's job; by another: not ours)
    previous = owner if owner is not None else released_by
    conn.execute("UPDATE leases SET owner = ?, token = ?, expires_at = ?, acquired_at = ?,"
                 " previous_owner = ? WHERE partition = ?",
                 (node, token + 1, now + ttl, now, previous, partition))
    return LeaseRow(partition, node, token + 1, now + ttl, previous,
                    reaped=owner is not None, ttl_left=ttl)


def renew_txn(conn: sqlite3.Connection, node: str, held: dict[int, int], now: float,
              ttl: float) -> list[int]:
    """Extend every lease in ``held`` (partition → token) still ours; the partitions lost.

    A lease that expired but that nobody took meanwhile is still ours (same token): renewing
    it is safe, since no other node can have written with a newer token."""
    lost = []
    for partition, token in held.items():
        cur = conn.execute("UPDATE leases SET expires_at = ? WHERE partition = ? AND owner = ?"
                           " AND token = ?", (now + ttl, partition, node, token))
        if cur.rowcount == 0:
            lost.append(partition)
    return lost


def release_txn(conn: sqlite3.Connection, node: str, held: dict[int, int]) -> None:
    """Give leases back (clean shutdown, drain, rebalance): expired now, token kept, so the
    next owner bumps it."""
    conn.executemany("UPDATE leases SET owner = NULL, expires_at = 0, previous_owner = ?"
                     " WHERE partition = ? AND owner = ? AND token = ?",
                     [(node, p, node, t) for p, t in held.items()])


def heartbeat_txn(conn: sqlite3.Connection, node: str, now: float, info: bytes,
                  seen_at: float, starting: bool = False) -> str:
    """Record the node as alive; returns its status (an operator may have set draining).

    ``now``: the node's wall clock (shown to people); ``seen_at``: the store's lease time
    (liveness). ``starting``: a node (re)starting under the same id comes back active."""
    row = conn.execute("SELECT status FROM nodes WHERE node_id = ?", (node,)).fetchone()
    if row is None or starting:
        conn.execute("INSERT INTO nodes(node_id, status, heartbeat_at, started_at, info,"
                     " seen_at) VALUES (?, 'active', ?, ?, ?, ?) ON CONFLICT(node_id) DO"
                     " UPDATE SET status = 'active', heartbeat_at = excluded.heartbeat_at,"
                     " started_at = excluded.started_at, info = excluded.info,"
                     " seen_at = excluded.seen_at", (node, now, now, info, seen_at))
        return "active"
    conn.execute("UPDATE nodes SET heartbeat_at = ?, info = ?, seen_at = ? WHERE node_id = ?",
                 (now, info, seen_at, node))
    return str(row[0])


def set_node_status_txn(conn: sqlite3.Connection, node: str, status: str) -> bool:
    cur = conn.execute("UPDATE nodes SET status = ? WHERE node_id = ?", (status, node))
    return cur.rowcount > 0


class LeaseRows(_StoreParts):
    """The Store's lease and node-registry operations (a mixin of :class:`Store`). Every
    lease time is read from ``lease_clock`` inside the transaction that uses it."""

    lease_clock: LeaseClock

    async def ensure_partitions(self, partitions: int) -> None:
        await self._writer.submit(lambda c: ensure_partitions_txn(c, partitions))

    async def acquire_lease(self, partition: int, node: str, ttl: float,
                            reclaim: bool = False) -> LeaseRow | None:
        row: LeaseRow | None = await self._writer.submit(
            lambda c: acquire_txn(c, partition, node, self.lease_clock.now(), ttl, reclaim),
            urgent=True)
        return row

    async def renew_leases(self, node: str, held: dict[int, int], ttl: float) -> list[int]:
        held = dict(held)
        lost: list[int] = await self._writer.submit(
            lambda c: renew_txn(c, node, held, self.lease_clock.now(), ttl), urgent=True)
        return lost

    async def release_leases(self, node: str, held: dict[int, int]) -> None:
        await self._writer.submit(lambda c: release_txn(c, node, dict(held)))

    async def node_heartbeat(self, node: str, now: float, info: dict[str, Any],
                             starting: bool = False) -> str:
        packed = msgpack.packb(info, use_bin_type=True)
        status: str = await self._writer.submit(
            lambda c: heartbeat_txn(c, node, now, packed, self.lease_clock.now(), starting),
            urgent=True)
        return status

    async def set_node_status(self, node: str, status: str) -> bool:
        changed: bool = await self._writer.submit(lambda c: set_node_status_txn(c, node, status))
        return changed

    async def leases(self) -> list[LeaseRow]:
        rows = await self._rows(
            "SELECT partition, owner, token, expires_at, previous_owner FROM leases"
            " ORDER BY partition")
        now = self.lease_clock.now()
        return [LeaseRow(r[0], r[1], r[2], r[3], r[4], ttl_left=r[3] - now) for r in rows]

    async def lease(self, partition: int) -> LeaseRow | None:
        r = await self._row(
            "SELECT partition, owner, token, expires_at, previous_owner FROM leases"
            " WHERE partition = ?", (partition,))
        if r is None:
            return None
        return LeaseRow(r[0], r[1], r[2], r[3], r[4], ttl_left=r[3] - self.lease_clock.now())

    async def nodes(self) -> list[NodeRow]:
        rows = await self._rows(
            "SELECT node_id, status, heartbeat_at, started_at, info, seen_at FROM nodes"
            " ORDER BY node_id")
        now = self.lease_clock.now()
        return [NodeRow(r[0], r[1], r[2], r[3], dict(_unpack(r[4]) or {}), age=now - r[5])
                for r in rows]
