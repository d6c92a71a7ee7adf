"""The bench scripts' view of nodes on a PostgreSQL store (bench/nodes.py and bench/chaos.py
with ``--store postgres``): the store read from outside (the same questions as
bench/nodes.py's ``StoreView`` asks of the SQLite file), what the server waits on
(pg_stat_activity sampled), and the CPU the server's processes used.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from bench.steps import proc_cpu_seconds

__all__ = ["PgView", "WaitSampler", "node_dsn", "postgres_cpu_seconds", "postmaster_pid"]


def node_dsn(url: str, node_id: str) -> str:
    """``url`` with ``application_name`` = the node id: pg_stat_activity then says whose
    session each backend serves."""
    return f"{url}{'&' if '?' in url else '?'}application_name={quote(node_id)}"


class PgView:
    """Read-only queries on the nodes' PostgreSQL database (autocommit: each query its own
    snapshot, no lock held between them). A lost connection (the server restarted) is
    opened again on the next query."""

    def __init__(self, url: str) -> None:
        self.url = node_dsn(url, "bench-view")
        self.conn: psycopg.Connection[Any] | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        for attempt in range(30):
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.url, autocommit=True)
                return self.conn.execute(sql, args).fetchall()
            except psycopg.OperationalError:
                self.close()
                if attempt == 29:
                    raise
                time.sleep(0.5)  # the server is restarting: a client's retry pacing
        raise AssertionError("unreachable")

    def count(self, status: str, tenant: str | None = None) -> int:
        if tenant is None:
            return int(self._rows("SELECT COUNT(*) FROM tasks WHERE status = %s",
                                  (status,))[0][0])
        return int(self._rows("SELECT COUNT(*) FROM tasks WHERE status = %s AND tenant = %s",
                              (status, tenant))[0][0])

    def statuses(self, workflow: str) -> dict[str, int]:
        return {str(s): int(n) for s, n in self._rows(
            "SELECT status, COUNT(*) FROM tasks WHERE workflow = %s GROUP BY status",
            (workflow,))}

    def status(self, task_id: str) -> str | None:
        found = self._rows("SELECT status FROM tasks WHERE task_id = %s", (task_id,))
        return str(found[0][0]) if found else None

    def running(self, workflow: str) -> dict[str, int]:
        return {str(t): int(s) for t, s in self._rows(
            "SELECT task_id, last_event_seq FROM tasks WHERE status = 'RUNNING'"
            " AND workflow = %s", (workflow,))}

    def owners(self) -> dict[int, str | None]:
        """partition → owner, of the leases not expired by the server's clock (the store's
        lease time: persistence/postgres/store.py's PgLeaseClock)."""
        return {int(p): (o if live else None) for p, o, live in self._rows(
            "SELECT partition, owner, expires_at > extract(epoch FROM clock_timestamp())"
            " FROM leases")}

    def events(self, task_id: str, after: int = 0) -> list[tuple[int, str, float, bytes]]:
        return [(int(s), str(t), float(a), bytes(p)) for s, t, a, p in self._rows(
            "SELECT sequence, type, occurred_at, payload FROM events WHERE task_id = %s"
            " AND sequence > %s ORDER BY sequence", (task_id, after))]

    def created_at(self, tenant: str) -> dict[str, float]:
        return {str(t): float(c) for t, c in self._rows(
            "SELECT task_id, created_at FROM tasks WHERE tenant = %s", (tenant,))}

    def succeeded_at(self, tenant: str) -> dict[str, float]:
        return {str(t): float(a) for t, a in self._rows(
            "SELECT e.task_id, e.occurred_at FROM events e JOIN tasks t USING (task_id)"
            " WHERE t.tenant = %s AND e.type = 'task.succeeded'", (tenant,))}

    def outcome(self, task_id: str) -> tuple[str | None, int, int]:
        """(status, handoffs, writes still IN_FLIGHT/UNKNOWN) of a chaos run's task."""
        status = self.status(task_id)
        handoffs = self._rows("SELECT COUNT(*) FROM handoffs WHERE task_id = %s",
                              (task_id,))[0][0]
        unsettled = self._rows(
            "SELECT COUNT(*) FROM actions WHERE task_id = %s AND status IN ('IN_FLIGHT',"
            " 'UNKNOWN') AND accepted = 0 AND kind = 'write'", (task_id,))[0][0]
        return status, int(handoffs), int(unsettled)


class WaitSampler:
    """A thread that samples the database's client backends every ``interval`` (what
    pg_stat_activity says each is doing): on CPU (active, no wait event), waiting on a
    heavyweight lock (``Lock``: a row lock, e.g. a lease row ``FOR UPDATE``), on a
    lightweight lock or I/O (the WAL flush of a commit), or — idle in a transaction —
    waiting for its node's next statement (a round trip)."""

    def __init__(self, url: str, interval: float = 0.05) -> None:
        self.url, self.interval = node_dsn(url, "bench-sampler"), interval
        self.samples = 0
        self.states: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-wait-sampler", daemon=True)

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(self.interval):
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity"
                    " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                    " AND datname = current_database() AND application_name NOT LIKE"
                    " 'bench-%%'").fetchall()
                self.samples += 1
                for state, kind, event in rows:
                    self.states[_classify(state, kind)] += 1
                    if state != "idle":
                        self.events[f"{kind or 'CPU'}:{event or '-'}"] += 1

    def summary(self) -> dict[str, Any]:
        """Per sample, how many backends were in each state (a mean: 0.5 = half a backend
        there all along), and the top wait events of the non-idle ones."""
        n = max(1, self.samples)
        return {"pg_wait_samples": self.samples,
                "pg_backends_mean": {k: round(v / n, 3) for k, v in
                                     sorted(self.states.items())},
                "pg_wait_events_top": {k: round(v / n, 3) for k, v in
                                       self.events.most_common(6)}}


def _classify(state: str | None, kind: str | None) -> str:
    if state == "idle":
        return "idle"
    if state and state.startswith("idle in transaction"):
        return "in_txn_waiting_for_node"
    if kind is None:
        return "cpu"
    if kind == "Lock":
        return "lock_wait"
    if kind in ("LWLock", "IO", "IPC"):
        return f"{kind.lower()}_wait"
    return f"other_wait:{kind}"


def postmaster_pid(pgdata: Path) -> int:
    """The server's main process (first line of ``postmaster.pid``)."""
    return int((pgdata / "postmaster.pid").read_text().splitlines()[0])


def postgres_cpu_seconds(postmaster: int) -> float:
    """CPU seconds of the whole server: the postmaster's own, its children that ended
    (cutime/cstime: backends of closed connections) and those alive now."""
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == postmaster:
                total += proc_cpu_seconds(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
    return total

