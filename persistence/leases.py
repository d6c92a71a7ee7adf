"""Partition leases with fencing tokens, and the node registry, as store transactions.

A lease row per partition: ``owner``, ``token`` and ``expires_at``. The token only ever
increases: it is bumped each time a partition changes hands (or is taken again after it
expired), never on renewal. Every write that comes from task execution names the
partition and the token its node holds; :func:`check_fence` runs inside that write's
transaction and refuses it unless the token is still the partition's current one and the
lease has not expired. So a node paused past its lease (a GC pause, SIGSTOP) that wakes up
can never commit, whatever it still believes: the check is in the store, not in memory.

Expiry is wall-clock time of the injected clock, compared across the processes of one
host; a lease is renewed every ``ttl / 4`` or so, well before that matters.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import msgpack

from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.store_rows import _StoreParts
from ratchet.protocol.errors import Fenced, PartitionCountMismatch

__all__ = [
    "LeaseRow",
    "LeaseRows",
    "NodeRow",
    "acquire_txn",
    "check_fence",
    "ensure_partitions_txn",
    "heartbeat_txn",
    "release_txn",
    "renew_txn",
    "set_node_status_txn",
]


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


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    status: str  # active | draining | stopped
    heartbeat_at: float
    started_at: float
    info: dict[str, Any]


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


def check_fence(conn: sqlite3.Connection, partition: int, token: int, now: float) -> None:
    """Raise :class:`Fenced` unless ``token`` is the partition's current, unexpired token."""
    row = conn.execute("SELECT owner, token, expires_at FROM leases WHERE partition = ?",
                       (partition,)).fetchone()
    if row is None or row[1] != token or row[2] <= now:
        raise Fenced("write refused: this node's lease on the partition is gone",
                     partition=partition, token=token,
                     current_token=row[1] if row else None, owner=row[0] if row else None)


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
                    reaped=owner is not None)


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
                  starting: bool = False) -> str:
    """Record the node as alive; returns its status (an operator may have set draining).

    ``starting``: a node (re)starting under the same id comes back active."""
    row = conn.execute("SELECT status FROM nodes WHERE node_id = ?", (node,)).fetchone()
    if row is None or starting:
        conn.execute("INSERT INTO nodes(node_id, status, heartbeat_at, started_at, info)"
                     " VALUES (?, 'active', ?, ?, ?) ON CONFLICT(node_id) DO UPDATE SET"
                     " status = 'active', heartbeat_at = excluded.heartbeat_at,"
                     " started_at = excluded.started_at, info = excluded.info",
                     (node, now, now, info))
        return "active"
    conn.execute("UPDATE nodes SET heartbeat_at = ?, info = ? WHERE node_id = ?",
                 (now, info, node))
    return str(row[0])


def set_node_status_txn(conn: sqlite3.Connection, node: str, status: str) -> bool:
    cur = conn.execute("UPDATE nodes SET status = ? WHERE node_id = ?", (status, node))
    return cur.rowcount > 0


class LeaseRows(_StoreParts):
    """The Store's lease and node-registry operations (a mixin of :class:`Store`)."""

    async def ensure_partitions(self, partitions: int) -> None:
        await self._writer.submit(lambda c: ensure_partitions_txn(c, partitions))

    async def acquire_lease(self, partition: int, node: str, now: float,
                            ttl: float, reclaim: bool = False) -> LeaseRow | None:
        row: LeaseRow | None = await self._writer.submit(
            lambda c: acquire_txn(c, partition, node, now, ttl, reclaim), urgent=True)
        return row

    async def renew_leases(self, node: str, held: dict[int, int], now: float,
                           ttl: float) -> list[int]:
        lost: list[int] = await self._writer.submit(
            lambda c: renew_txn(c, node, dict(held), now, ttl), urgent=True)
        return lost

    async def release_leases(self, node: str, held: dict[int, int]) -> None:
        await self._writer.submit(lambda c: release_txn(c, node, dict(held)))

    async def node_heartbeat(self, node: str, now: float, info: dict[str, Any],
                             starting: bool = False) -> str:
        packed = msgpack.packb(info, use_bin_type=True)
        status: str = await self._writer.submit(
            lambda c: heartbeat_txn(c, node, now, packed, starting), urgent=True)
        return status

    async def set_node_status(self, node: str, status: str) -> bool:
        changed: bool = await self._writer.submit(lambda c: set_node_status_txn(c, node, status))
        return changed

    async def leases(self) -> list[LeaseRow]:
        rows = await self._rows(
            "SELECT partition, owner, token, expires_at, previous_owner FROM leases"
            " ORDER BY partition")
        return [LeaseRow(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    async def lease(self, partition: int) -> LeaseRow | None:
        r = await self._row(
            "SELECT partition, owner, token, expires_at, previous_owner FROM leases"
            " WHERE partition = ?", (partition,))
        return None if r is None else LeaseRow(r[0], r[1], r[2], r[3], r[4])

    async def nodes(self) -> list[NodeRow]:
        rows = await self._rows(
            "SELECT node_id, status, heartbeat_at, started_at, info FROM nodes"
            " ORDER BY node_id")
        return [NodeRow(r[0], r[1], r[2], r[3], dict(_unpack(r[4]) or {})) for r in rows]
