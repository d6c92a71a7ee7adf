"""Helpers of the multi-node PostgreSQL tests (tests/test_pg_*.py): nodes as separate
machines (each its own state dir, no shared files; the store is PostgreSQL), and a
commit log the database keeps by itself, so a test can say which node committed what and
whether it held the partition's lease when it did.

The commit log: deferred constraint triggers — they run as a transaction commits, inside
it — number every committed ``events`` row (with the committing session's
``application_name``: each node's DSN names its node) and every change of a lease's owner
or token, from one sequence. A write commits under its partition's lease row lock (the
fence check reads it ``FOR UPDATE``), so for one partition the numbers are the commit
order.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from bench.steps import NodeProc
from ratchet.persistence.store_select import open_store
from ratchet.protocol.subjects import partition_of

COMMIT_LOG = """
CREATE SEQUENCE commit_order;
CREATE TABLE commit_log (ord BIGINT PRIMARY KEY, app TEXT, task_id TEXT, seq BIGINT,
                         type TEXT, at DOUBLE PRECISION);
CREATE TABLE lease_log (ord BIGINT PRIMARY KEY, partition BIGINT, owner TEXT, token BIGINT,
                        at DOUBLE PRECISION);
CREATE FUNCTION log_event_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO commit_log VALUES (nextval('commit_order'),
    current_setting('application_name'), NEW.task_id, NEW.sequence, NEW.type,
    extract(epoch FROM clock_timestamp()));
  RETURN NULL;
END $$;
CREATE FUNCTION log_lease_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO lease_log VALUES (nextval('commit_order'), NEW.partition, NEW.owner,
    NEW.token, extract(epoch FROM clock_timestamp()));
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER events_committed AFTER INSERT ON events
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION log_event_commit();
CREATE CONSTRAINT TRIGGER leases_changed AFTER UPDATE ON leases
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (OLD.owner IS DISTINCT FROM NEW.owner OR OLD.token <> NEW.token)
  EXECUTE FUNCTION log_lease_change();
"""

#: The cluster's secret key (docs/security-secrets.md): one for every node, as a deployment
#: hands it to each machine (RATCHET_SECRET_KEY), not a file any node could read.
SECRET_KEY = os.urandom(32).hex()
#: The audit chain's key (docs/security.md, "The audit key"): the same for every node, handed
#: to each machine the same way (RATCHET_AUDIT_KEY); the store refuses a node with another.
AUDIT_KEY = os.urandom(32).hex()

#: Events only the task's owner writes, through the fence (intake's ``task.queued`` is
#: written by whichever node accepted the submit).
FENCED_TYPES = ("step.completed", "task.succeeded", "action.started", "action.succeeded")


def node_dsn(url: str, node_id: str) -> str:
    """``url`` with ``application_name`` = the node id (what the commit log records)."""
    return f"{url}{'&' if '?' in url else '?'}application_name={quote(node_id)}"


async def prepare(url: str, partitions: int = 16) -> None:
    """Migrate the database, make its partitions and install the commit log (before any
    node starts, so the log sees every lease taken)."""
    store = await open_store(url)
    try:
        await store.ensure_partitions(partitions)
    finally:
        await store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(COMMIT_LOG)


def commits_outside_lease(url: str) -> list[tuple[Any, ...]]:
    """Fenced events committed by a node that did not hold the task's partition lease at
    that moment (by the lease log's last change before it): must be none."""
    with psycopg.connect(url) as conn:
        leases = conn.execute("SELECT ord, partition, owner FROM lease_log ORDER BY ord").fetchall()
        events = conn.execute("SELECT ord, app, task_id, seq, type FROM commit_log"
                              " WHERE type = ANY(%s) ORDER BY ord", (list(FENCED_TYPES),)
                              ).fetchall()
    owner: dict[int, str | None] = {}
    changes = iter(leases)
    change = next(changes, None)
    bad = []
    for ord_, app, task_id, seq, type_ in events:
        while change is not None and change[0] < ord_:
            owner[int(change[1])] = change[2]
            change = next(changes, None)
        partition = partition_of(task_id)
        if owner.get(partition) != app:
            bad.append((ord_, app, task_id, seq, type_, partition, owner.get(partition)))
    return bad


def rows(url: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def events_by_task(url: str, task_ids: list[str]) -> dict[str, list[tuple[int, str, bytes]]]:
    out: dict[str, list[tuple[int, str, bytes]]] = {t: [] for t in task_ids}
    for task_id, seq, type_, payload in rows(
            url, "SELECT task_id, sequence, type, payload FROM events WHERE task_id = ANY(%s)"
            " ORDER BY task_id, sequence", (task_ids,)):
        out[task_id].append((int(seq), str(type_), bytes(payload)))
    return out


def owners(url: str) -> dict[int, tuple[str | None, int]]:
    """partition → (owner, token), as the leases table says now."""
    return {int(p): (o, int(t)) for p, o, t in rows(
        url, "SELECT partition, owner, token FROM leases")}


def machine(base: Path, name: str, dsn: str, nats_url: str, app: str, *,
            args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> NodeProc:
    """A node as if on its own machine: its own state dir and log, the store by DSN."""
    return NodeProc(base / name, nats_url, app=app, log_level="warning",
                    env={"RATCHET_STORE": node_dsn(dsn, name), "RATCHET_SECRET_KEY": SECRET_KEY,
                         "RATCHET_AUDIT_KEY": AUDIT_KEY, **(env or {})},
                    args=("--node-id", name, *args), log_path=base / f"{name}.log")


async def start_machines(nodes: list[NodeProc]) -> None:
    """Start the nodes one after the other (each has the audit key from its environment:
    nothing is copied between their state dirs)."""
    for node in nodes:
        await asyncio.to_thread(node.start)


async def until(cond: Callable[[], Any], timeout: float, why: str,
                poll: float = 0.1) -> Any:
    """Poll ``cond`` (sync, run on a thread) until truthy; bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := await asyncio.to_thread(cond):
            return value
        await asyncio.sleep(poll)  # poll pacing under the deadline
    raise AssertionError(f"not within {timeout} s: {why}")
