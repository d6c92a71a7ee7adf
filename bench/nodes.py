"""Figures of several nodes sharing one nats-server and one SQLite store. Progress goes to
stderr; one JSON object is the last line of stdout.

(a) tasks_per_s_1/2/3: 1, 2, 3 ``ratchet serve`` processes (the default writer, ``loop``
    for NORMAL; then again with ``--writer thread``: keys ``..._thread``) on a fresh nats-server and a fresh store; 2,000
    5-step tasks published at once; first publish → last ``task.succeeded`` committed. Alongside, what limits it:
    the CPU each process used (/proc/pid/stat) against the cores there are, the nodes'
    group-commit figures (printed at stop), and a write-lock probe: how long a
    ``BEGIN IMMEDIATE`` on the shared file waits, tried every 50 ms by this process.
(b) failover_p50_s / failover_p99_s: 3 nodes keep 30 ``long`` tasks (60 steps of 0.1 s)
    running; each round SIGKILLs one node and times, from the kill, the first
    ``step.completed`` of a task of its partitions committed by another node
    (``failover_all_*``: until every one of them had); then starts a replacement under a
    fresh id and waits until the partitions are shared out again. Default leases: TTL 5 s,
    heartbeat 1 s. Afterwards every task must end: ``failover_task_outcomes`` counts how
    (WAITING_APPROVAL: parked by the crash-loop guard); the SUCCEEDED ones are audited:
    each step completed once, gapless event sequences.
(c) tenant_b_p99_s: tenant A floods 10,000 five-step tasks; right after, while they are
    queued, tenant B submits 20, spread over 4 s, the same way (JetStream); B's submit →
    ``task.succeeded`` committed, on 3 nodes and on 1 (``_1node``). Beside it:
    ``tenant_b_accept_p99_s`` (submit → task row created) and ``tenant_b_sync_p99_s``: 20
    more of B's, interleaved, submitted over request/reply (``submit_sync``) instead. Run
    with the default serve flags and again with ``--max-running 32`` (keys ``..._max_running_32``).

    python bench/nodes.py [--quick] [--only throughput,failover,tenants] [--keep DIR]
    python bench/nodes.py --store postgres [--quick]     (bench/nodes_pg.py: its figures)

The nodes serve this module's ``app``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.steps import NodeProc, percentile, proc_cpu_seconds, publish_submit
from ratchet.persistence.leases import HostLeaseClock
from ratchet.protocol.codec import decode_map
from ratchet.protocol.ids import task_id_for
from ratchet.protocol.subjects import DEFAULT_PARTITIONS, partition_of
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.credentials import admin_key_path
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

LONG_STEPS = 60
LONG_STEP_S = 0.1


def _workflow(name: str, steps: int, sleep: float = 0.0) -> ratchet.Workflow:
    wf = ratchet.Workflow(name, version=1)
    for i in range(steps):
        async def step(ctx: ratchet.StepContext) -> dict[str, Any]:
            if sleep:
                await asyncio.sleep(sleep)
            return {"n": ctx.state.get("n", 0) + 1}

        wf.add_step(f"s{i}", step)
    return wf


app = ratchet.Registry([_workflow("five", 5), _workflow("long", LONG_STEPS, LONG_STEP_S)])


def say(message: str) -> None:
    print(f"[nodes {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _p(values: list[float], p: float) -> float:
    return round(percentile(values, p), 3) if values else -1.0


# -- the store, read from outside ---------------------------------------------------------


class StoreView:
    """Read-only queries on the nodes' SQLite file (WAL: never blocks their writes)."""

    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None,
                                    timeout=30.0)

    def close(self) -> None:
        self.conn.close()

    def count(self, status: str, tenant: str | None = None) -> int:
        sql, args = "SELECT COUNT(*) FROM tasks WHERE status = ?", [status]
        if tenant is not None:
            sql, args = sql + " AND tenant = ?", [status, tenant]
        return int(self.conn.execute(sql, args).fetchone()[0])

    def statuses(self, workflow: str) -> dict[str, int]:
        return dict(self.conn.execute("SELECT status, COUNT(*) FROM tasks WHERE workflow = ?"
                                      " GROUP BY status", (workflow,)).fetchall())

    def status(self, task_id: str) -> str | None:
        row = self.conn.execute("SELECT status FROM tasks WHERE task_id = ?",
                                (task_id,)).fetchone()
        return str(row[0]) if row else None

    def running(self, workflow: str) -> dict[str, int]:
        """task id → last event sequence, of the workflow's RUNNING tasks."""
        return dict(self.conn.execute(
            "SELECT task_id, last_event_seq FROM tasks WHERE status = 'RUNNING'"
            " AND workflow = ?", (workflow,)).fetchall())

    def owners(self) -> dict[int, str | None]:
        """partition → owner, of the leases not expired (lease times are the store's: the
        host's boot time, persistence/leases.py)."""
        now = HostLeaseClock().now()
        return {p: (o if exp > now else None) for p, o, exp in self.conn.execute(
            "SELECT partition, owner, expires_at FROM leases")}

    def events(self, task_id: str, after: int = 0) -> list[tuple[int, str, float, bytes]]:
        return list(self.conn.execute(
            "SELECT sequence, type, occurred_at, payload FROM events WHERE task_id = ?"
            " AND sequence > ? ORDER BY sequence", (task_id, after)))

    def created_at(self, tenant: str) -> dict[str, float]:
        """task id → when the task was accepted (its row created), for the tenant's tasks."""
        return dict(self.conn.execute("SELECT task_id, created_at FROM tasks WHERE tenant = ?",
                                      (tenant,)).fetchall())

    def succeeded_at(self, tenant: str) -> dict[str, float]:
        """task id → when its ``task.succeeded`` committed, for the tenant's tasks."""
        return dict(self.conn.execute(
            "SELECT e.task_id, e.occurred_at FROM events e JOIN tasks t USING (task_id)"
            " WHERE t.tenant = ? AND e.type = 'task.succeeded'", (tenant,)).fetchall())


class LockProbe:
    """A thread that times ``BEGIN IMMEDIATE`` on the shared file every ``interval``: how
    long a writer waits for the write lock (SQLite's busy handler sleeps and retries)."""

    def __init__(self, db: Path, interval: float = 0.05) -> None:
        self.db, self.interval = db, interval
        self.waits: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lock-probe", daemon=True)

    def __enter__(self) -> LockProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self.db, isolation_level=None, timeout=30.0)
        try:
            while not self._stop.wait(self.interval):
                t0 = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                self.waits.append(time.perf_counter() - t0)
                conn.execute("ROLLBACK")
        finally:
            conn.close()

    def summary(self) -> dict[str, float]:
        ms = [w * 1000 for w in self.waits]
        # A probe at a random moment finds the lock free about as often as it is free.
        busy = sum(w > 0.5 for w in ms) / len(ms) if ms else 0.0
        return {"lock_wait_p50_ms": _p(ms, 0.5), "lock_wait_p99_ms": _p(ms, 0.99),
                "lock_wait_max_ms": round(max(ms), 3) if ms else -1.0,
                "lock_busy_pct": round(100 * busy, 1)}


# -- a cluster of nodes -------------------------------------------------------------------


@dataclass
class Cluster:
    """``ratchet serve`` processes on one nats-server and one store (``base/store``)."""

    base: Path
    url: str
    flags: tuple[str, ...] = ()
    nats_pid: int | None = None
    app: str = "bench.nodes:app"
    env: dict[str, str] = field(default_factory=dict)
    log_level: str = "warning"
    nodes: dict[str, NodeProc] = field(default_factory=dict)
    #: A PostgreSQL database the nodes share instead of the SQLite file (each node's
    #: session named after it), and the server's postmaster (its CPU is metered).
    store_url: str | None = None
    pg_pid: int | None = None

    @property
    def db(self) -> Path:
        return self.base / "store" / "ratchet.db"

    @property
    def creds(self) -> Path:
        """The store's local admin key (every node of the store shares its state dir)."""
        return admin_key_path(self.base / "store")

    def view(self) -> Any:
        """A read-only view of the store: a ``StoreView``, or on PostgreSQL a ``PgView``
        (bench/pg_view.py: the same questions)."""
        if self.store_url is None:
            return StoreView(self.db)
        from bench.pg_view import PgView  # psycopg: a dev extra, only on this path

        return PgView(self.store_url)

    def start(self, node_id: str) -> None:
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        env = dict(self.env)
        if self.store_url is not None:
            from bench.pg_view import node_dsn

            env["RATCHET_STORE"] = node_dsn(self.store_url, node_id)
        node = NodeProc(self.base / "store", self.url, app=self.app, log_level=self.log_level,
                        synchronous="NORMAL", env=env,
                        args=("--node-id", node_id, *self.flags),
                        log_path=self.base / "logs" / f"{node_id}.log")
        node.start()
        self.nodes[node_id] = node

    def kill(self, node_id: str) -> float:
        """SIGKILL the node; returns the wall time just before the signal."""
        node = self.nodes.pop(node_id)
        t = time.time()
        node.kill()
        return t

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every node cleanly; returns each one's closing figures."""
        closing = {nid: node.stop() for nid, node in self.nodes.items()}
        self.nodes.clear()
        return closing

    async def balanced(self, view: Any, timeout: float = 60.0) -> float:
        """Wait until every partition is held by a live node and the shares are settled.

        Each node aims at ceil(partitions / nodes) and only the nodes above it give any
        up, so 16 partitions on 3 nodes may settle at 6/6/4: settled means nobody is above
        the target and nobody is below what the others leave over."""
        t0 = time.monotonic()
        target = math.ceil(DEFAULT_PARTITIONS / len(self.nodes))
        floor = max(1, DEFAULT_PARTITIONS - (len(self.nodes) - 1) * target)
        while time.monotonic() - t0 < timeout:
            owners = view.owners()
            held = {nid: sum(o == nid for o in owners.values()) for nid in self.nodes}
            if all(o in self.nodes for o in owners.values()) \
                    and floor <= min(held.values()) and max(held.values()) <= target:
                return time.monotonic() - t0
            await asyncio.sleep(0.2)
        raise TimeoutError(f"partitions not shared out in {timeout} s: {view.owners()}")

    def log_levels(self) -> dict[str, int]:
        """How many warning/error/critical lines the nodes logged."""
        counts: dict[str, int] = {}
        for path in (self.base / "logs").glob("*.log"):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    level = json.loads(line).get("level", "?")
                except ValueError:
                    level = "unparsed"
                counts[level] = counts.get(level, 0) + 1
        return counts


@asynccontextmanager
async def cluster(base: Path, count: int, flags: tuple[str, ...],
                  store_url: str | None = None,
                  pg_pid: int | None = None) -> AsyncIterator[Cluster]:
    """A fresh nats-server and ``count`` nodes (n1..nN), partitions shared out; the store
    is ``store_url`` (a fresh PostgreSQL database) if given, else a fresh SQLite file."""
    server = EmbeddedNats(base / "nats")
    url = await server.start()
    c = Cluster(base, url, flags, nats_pid=int(server.pid_file.read_text()),
                store_url=store_url, pg_pid=pg_pid)
    try:
        for i in range(1, count + 1):
            c.start(f"n{i}")
        view = c.view()
        try:
            await c.balanced(view)
        finally:
            view.close()
        yield c
    finally:
        c.stop()
        await server.stop()


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine (/proc/stat), every process."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


@contextmanager
def cpu_meter(c: Cluster) -> Iterator[dict[str, Any]]:
    """CPU percent (100 = one core) over the block: each node, the nats-server, this
    process, PostgreSQL's processes (on that store), their total, and the whole machine's
    (other users' processes included); ``seconds``: the CPU seconds behind each."""
    pids = {nid: n.proc.pid for nid, n in c.nodes.items() if n.proc}
    before = {k: proc_cpu_seconds(pid) for k, pid in pids.items()}
    nats_before = proc_cpu_seconds(c.nats_pid) if c.nats_pid else 0.0
    pg_before = _pg_cpu(c)
    me, machine, t0 = time.process_time(), _machine_jiffies(), time.monotonic()
    out: dict[str, Any] = {}
    yield out
    wall = time.monotonic() - t0

    def pct(seconds: float) -> float:
        return round(100 * seconds / wall, 1)

    seconds = {k: proc_cpu_seconds(pid) - before[k] for k, pid in pids.items()}
    seconds["nats"] = proc_cpu_seconds(c.nats_pid) - nats_before if c.nats_pid else 0.0
    seconds["bench"] = time.process_time() - me
    out["nodes"] = {k: pct(seconds[k]) for k in pids}
    out["nats"] = pct(seconds["nats"])
    out["bench"] = pct(seconds["bench"])
    if c.pg_pid is not None:
        seconds["postgres"] = _pg_cpu(c) - pg_before
        out["postgres"] = pct(seconds["postgres"])
    out["total"] = round(sum(out["nodes"].values()) + out["nats"] + out["bench"]
                         + out.get("postgres", 0.0), 1)
    out["seconds"] = {k: round(v, 2) for k, v in seconds.items()}
    out["wall_s"] = round(wall, 2)
    busy, total = _machine_jiffies()
    out["machine"] = round(100 * (os.cpu_count() or 1) * (busy - machine[0])
                           / max(1, total - machine[1]), 1)


def _pg_cpu(c: Cluster) -> float:
    if c.pg_pid is None:
        return 0.0
    from bench.pg_view import postgres_cpu_seconds

    return postgres_cpu_seconds(c.pg_pid)


async def _wait(cond: Callable[[], bool], timeout: float, what: str,
                poll: float = 0.2) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not within {timeout} s")
        await asyncio.sleep(poll)


# -- (a) throughput -----------------------------------------------------------------------


async def throughput(base: Path, nodes: int, tasks: int, writer: str,
                     store_url: str | None = None, pg_pid: int | None = None) -> dict[str, Any]:
    """On PostgreSQL (``store_url``) the write-lock probe is a sampler of what the
    server's backends wait on (bench/pg_view.py's ``WaitSampler``)."""
    async with cluster(base, nodes, ("--writer", writer), store_url, pg_pid) as c:
        view = c.view()
        client = await ratchet.Client.connect(c.url, "bench", creds=c.creds)
        try:
            with _probe(c) as probe, cpu_meter(c) as cpu:
                t0 = time.time()
                futures = [await publish_submit(client, "five", f"t-{i}") for i in range(tasks)]
                await asyncio.gather(*futures)
                await _wait(lambda: view.count("SUCCEEDED") >= tasks, 600, "throughput run")
            end = max(view.succeeded_at("bench").values())
        finally:
            await client.close()
            view.close()
        closing = c.stop()
        levels = c.log_levels()
    commits = {nid: {k: v for k, v in fig.items() if k.startswith("commit_")}
               for nid, fig in closing.items()}
    rate = round(tasks / (end - t0), 1)
    say(f"{nodes} node(s), writer {writer}: {rate} tasks/s, cpu {cpu}, "
        f"lock probe {probe.summary()}, commits {commits}, log levels {levels}")
    return {"tasks_per_s": rate, "cpu_pct": cpu, **probe.summary(), "commits": commits,
            "log_levels": levels}


def _probe(c: Cluster) -> Any:
    if c.store_url is None:
        return LockProbe(c.db)
    from bench.pg_view import WaitSampler

    return WaitSampler(c.store_url)


def scaling_note(runs: dict[int, dict[str, Any]], cores: int) -> str:
    """What the figures say limits scaling (only what was measured)."""
    parts = []
    for n, r in sorted(runs.items()):
        cpu = r["cpu_pct"]
        nodes_cpu = "+".join(f"{v:.0f}" for v in cpu["nodes"].values())
        p99 = max((f.get("commit_p99_ms", 0.0) for f in r["commits"].values()), default=0.0)
        parts.append(f"{n} node(s): {r['tasks_per_s']} tasks/s, CPU nodes {nodes_cpu}% + "
                     f"nats {cpu['nats']:.0f}% + bench {cpu['bench']:.0f}% = "
                     f"{cpu['total']:.0f}% (machine {cpu['machine']:.0f}%) of {cores * 100}%,"
                     f" write lock busy {r['lock_busy_pct']}%, wait p50/p99 "
                     f"{r['lock_wait_p50_ms']}/{r['lock_wait_p99_ms']} ms, "
                     f"commit p99 (lock wait included) {p99} ms")
    top = runs[max(runs)]
    machine, capacity = top["cpu_pct"]["machine"], cores * 100
    lock = (f"the one SQLite write lock, which every commit of every node takes, was busy "
            f"{top['lock_busy_pct']}% of the time (a BEGIN IMMEDIATE probe waited p50/p99/max "
            f"{top['lock_wait_p50_ms']}/{top['lock_wait_p99_ms']}/{top['lock_wait_max_ms']} "
            f"ms; a waiting writer sleeps in SQLite's busy handler)")
    if machine >= 0.85 * capacity:
        verdict = (f"CPU-bound: at {max(runs)} nodes the machine was {machine:.0f}% busy of "
                   f"{capacity}%; {lock}")
    elif top["lock_busy_pct"] >= 70:
        verdict = (f"write-lock-bound: at {max(runs)} nodes the machine was only "
                   f"{machine:.0f}% busy of {capacity}% while {lock}")
    else:
        verdict = (f"neither CPU nor the write lock saturated at {max(runs)} nodes (machine "
                   f"{machine:.0f}% of {capacity}%; {lock})")
    single = runs[min(runs)]["cpu_pct"]["nodes"]
    return (f"{verdict}. One node uses at most one core ({max(single.values()):.0f}% at "
            f"{min(runs)} node: one Python event loop). Measured: " + "; ".join(parts))


# -- (b) failover -------------------------------------------------------------------------


async def _resumed(view: Any, tasks: dict[str, int], killed: str, t_kill: float,
                   timeout: float) -> dict[str, float]:
    """task id → seconds from the kill to its first step committed elsewhere, once each
    task recorded ``task.recovered`` (previous owner: ``killed``) and then a step."""
    resumed: dict[str, float] = {}
    recovered: set[str] = set()
    last = dict(tasks)
    deadline = time.monotonic() + timeout
    while len(resumed) < len(tasks) and time.monotonic() < deadline:
        for task_id in tasks.keys() - resumed.keys():
            for seq, kind, at, payload in view.events(task_id, last[task_id]):
                last[task_id] = seq
                if kind == "task.recovered" and at > t_kill:
                    body = decode_map(payload)
                    if body.get("previous_owner") != killed:
                        say(f"  {task_id} recovered naming {body.get('previous_owner')!r}"
                            f" ({body.get('reason')}), not {killed}")
                    recovered.add(task_id)
                elif kind == "step.completed" and at > t_kill and task_id in recovered:
                    resumed[task_id] = at - t_kill
                    break
        await asyncio.sleep(0.1)
    return resumed


def _all_started(view: Any, submitted: int) -> bool:
    statuses = view.statuses("long")
    return sum(statuses.values()) == submitted and "QUEUED" not in statuses


async def failover(base: Path, kills: int, concurrent: int, seed: int,
                   store_url: str | None = None) -> dict[str, Any]:
    rng = random.Random(seed)
    firsts: list[float] = []
    alls: list[float] = []
    rebalance: list[float] = []
    stranded = 0
    async with cluster(base, 3, (), store_url) as c:
        view = c.view()
        client = await ratchet.Client.connect(c.url, "bench", creds=c.creds)
        submitted = 0
        try:
            for k in range(kills):
                running = sum(n for s, n in view.statuses("long").items()
                              if s in ("QUEUED", "RUNNING"))
                for _ in range(concurrent - running):
                    await publish_submit(client, "long", f"long-{submitted}")
                    submitted += 1
                await _wait(partial(_all_started, view, submitted), 60, "long tasks started")
                await asyncio.sleep(rng.uniform(0.5, 1.5))  # a random moment mid-step
                victim = rng.choice(sorted(c.nodes))
                partitions = {p for p, o in view.owners().items() if o == victim}
                mine = {t: s for t, s in view.running("long").items()
                        if partition_of(t) in partitions}
                t_kill = c.kill(victim)
                resumed = await _resumed(view, mine, victim, t_kill, timeout=60)
                stranded += len(mine) - len(resumed)
                if resumed:
                    firsts.append(min(resumed.values()))
                    alls.append(max(resumed.values()))
                replacement = f"n{4 + k}"  # fresh: it may not reclaim the victim's leases
                c.start(replacement)
                rebalance.append(await c.balanced(view))
                say(f"kill {k + 1}/{kills}: {victim} ({len(partitions)} partitions, "
                    f"{len(mine)} running tasks) → first step elsewhere after "
                    f"{min(resumed.values(), default=-1):.2f} s, all {len(resumed)} after "
                    f"{max(resumed.values(), default=-1):.2f} s; {replacement} got its share"
                    f" {rebalance[-1]:.1f} s after start")
            say(f"waiting for the {submitted} long tasks to finish")
            await _wait(lambda: not {"QUEUED", "RUNNING"} & view.statuses("long").keys(),
                        LONG_STEPS * LONG_STEP_S * 4 + 60, "long tasks finishing", poll=1.0)
            outcomes = view.statuses("long")
            audit = _audit(view, [t for t in (task_id_for("bench", f"long-{i}")
                                              for i in range(submitted))
                                  if view.status(t) == "SUCCEEDED"])
        finally:
            await client.close()
            view.close()
        c.stop()
        levels = c.log_levels()
    return {"failover_p50_s": _p(firsts, 0.5), "failover_p99_s": _p(firsts, 0.99),
            "failover_max_s": round(max(firsts), 3) if firsts else -1.0,
            "failover_all_p50_s": _p(alls, 0.5), "failover_all_p99_s": _p(alls, 0.99),
            "failover_kills": len(firsts), "failover_stranded_tasks": stranded,
            "rebalance_after_join_p50_s": _p(rebalance, 0.5),
            "lease_ttl_s": 5.0, "lease_interval_s": 1.0, "failover_long_tasks": submitted,
            "failover_task_outcomes": outcomes,
            **audit, "failover_log_levels": levels}


def _audit(view: Any, task_ids: list[str]) -> dict[str, int]:
    """The finished tasks' events: gapless sequences, each step completed exactly once."""
    gaps = doubled = missing = 0
    for task_id in task_ids:
        events = view.events(task_id)
        gaps += [e[0] for e in events] != list(range(1, len(events) + 1))
        steps = [decode_map(e[3]).get("index") for e in events if e[1] == "step.completed"]
        doubled += len(steps) != len(set(steps))
        missing += len(set(steps)) != LONG_STEPS
    return {"failover_event_gaps": gaps, "failover_steps_doubled": doubled,
            "failover_steps_missing": missing}


# -- (c) one tenant floods, another submits a few -----------------------------------------


async def tenants(base: Path, nodes: int, flood: int, b_tasks: int, b_spread: float,
                  flags: tuple[str, ...]) -> dict[str, Any]:
    async with cluster(base, nodes, flags) as c:
        view = StoreView(c.db)
        a = await ratchet.Client.connect(c.url, "tenant_a", creds=c.creds)
        b = await ratchet.Client.connect(c.url, "tenant_b", creds=c.creds)
        seen: dict[str, float] = {}

        async def on_b_success(msg: Any) -> None:
            seen.setdefault(decode_map(msg.data)["task_id"], time.time())

        sub = await b.nc.subscribe("ratchet.events.tenant_b.*.task.succeeded", cb=on_b_success)
        try:
            t0 = time.time()
            await asyncio.gather(*[await publish_submit(a, "five", f"a-{i}")
                                   for i in range(flood)])
            say(f"tenant A: {flood} published in {time.time() - t0:.1f} s; tenant B submits")
            # B submits the same way as A (JetStream, behind A's messages in the submit
            # stream) and, interleaved, through the request/reply API (submit_sync).
            submitted: dict[str, float] = {}
            synced: dict[str, float] = {}
            for i in range(b_tasks):
                submitted[task_id_for("tenant_b", f"b-{i}")] = time.time()
                await (await publish_submit(b, "five", f"b-{i}"))
                synced[task_id_for("tenant_b", f"bs-{i}")] = time.time()
                await b.submit_sync("five", {}, f"bs-{i}")
                await asyncio.sleep(b_spread / b_tasks)
            a_pending = flood - view.count("SUCCEEDED", "tenant_a")
            await _wait(lambda: view.count("SUCCEEDED", "tenant_b") >= 2 * b_tasks, 600,
                        "tenant B")
            b_done = view.succeeded_at("tenant_b")
            created = view.created_at("tenant_b")
            say(f"tenant B done; {flood - view.count('SUCCEEDED', 'tenant_a')} of A's to go")
            await _wait(lambda: view.count("SUCCEEDED", "tenant_a") >= flood, 900, "tenant A",
                        poll=0.5)
            a_done = max(view.succeeded_at("tenant_a").values()) - t0
        finally:
            await sub.unsubscribe()
            await a.close()
            await b.close()
            view.close()
    latencies = [b_done[t] - s for t, s in submitted.items()]
    seen_latencies = [seen[t] - s for t, s in submitted.items() if t in seen]
    accepted = [created[t] - s for t, s in submitted.items()]
    sync_latencies = [b_done[t] - s for t, s in synced.items()]
    say(f"{nodes} node(s): B p50 {_p(latencies, 0.5)} s p99 {_p(latencies, 0.99)} s "
        f"(accepted after p99 {_p(accepted, 0.99)} s; via submit_sync p99 "
        f"{_p(sync_latencies, 0.99)} s); A's flood done in {a_done:.1f} s")
    return {"tenant_b_p50_s": _p(latencies, 0.5), "tenant_b_p99_s": _p(latencies, 0.99),
            "tenant_b_p99_seen_s": _p(seen_latencies, 0.99),
            "tenant_b_accept_p99_s": _p(accepted, 0.99),
            "tenant_b_sync_p99_s": _p(sync_latencies, 0.99),
            "tenant_a_done_s": round(a_done, 2), "tenant_a_pending_after_b_submitted": a_pending,
            "tenant_nodes": nodes, "tenant_flags": " ".join(flags)}


# -- main ---------------------------------------------------------------------------------


async def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"cores": os.cpu_count()}
    only = set(args.only.split(","))
    if "throughput" in only:
        runs: dict[int, dict[str, Any]] = {}
        for writer in args.writers.split(","):
            for n in (1, 2, 3):
                say(f"throughput: {n} node(s), {args.tasks} tasks, --writer {writer}")
                r = await throughput(base / f"tp-{writer}-{n}", n, args.tasks, writer)
                suffix = "" if writer == "loop" else f"_{writer}"
                results[f"tasks_per_s_{n}{suffix}"] = r["tasks_per_s"]
                results[f"throughput_detail_{n}{suffix}"] = {
                    k: v for k, v in r.items() if k != "tasks_per_s"}
                if writer == "loop":
                    runs[n] = r
        results["throughput_tasks"] = args.tasks
        results["scaling_note"] = scaling_note(runs, os.cpu_count() or 1)
    if "failover" in only:
        say(f"failover: 3 nodes, {args.kills} kills, {args.concurrent} long tasks at once")
        results.update(await failover(base / "failover", args.kills, args.concurrent,
                                      args.seed))
    if "tenants" in only:
        for i, extra in enumerate(args.tenant_flags.split(",")):
            flags = tuple(extra.split())  # the default writer unless the flags say otherwise
            # the first flag set unmarked; e.g. "--max-running 32" → "_max_running_32"
            marker = "_" + "_".join(extra.replace("-", " ").split()) if i else ""
            for n in args.tenant_nodes:
                say(f"tenants: {n} node(s) {' '.join(flags)}, A floods {args.flood}, "
                    f"B submits {args.b_tasks}")
                r = await tenants(base / f"tenants-{n}{marker}", n, args.flood, args.b_tasks,
                                  args.b_spread, flags)
                suffix = ("" if n == max(args.tenant_nodes) else f"_{n}node") + marker
                results.update({f"{k}{suffix}": v for k, v in r.items()})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--only", default="throughput,failover,tenants")
    parser.add_argument("--tasks", type=int, default=2000, help="throughput: tasks per run")
    parser.add_argument("--writers", default="loop,thread",
                        help="throughput: writers to try (the first gives the unmarked keys)")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=30, help="failover: long tasks")
    parser.add_argument("--flood", type=int, default=10_000, help="tenant A's tasks")
    parser.add_argument("--b-tasks", type=int, default=20, help="tenant B's tasks")
    parser.add_argument("--b-spread", type=float, default=4.0, help="seconds B submits over")
    parser.add_argument("--tenant-nodes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--tenant-flags", default=",--max-running 32",
                        help="comma-separated sets of extra serve flags to run the tenant "
                        "figures with; keys of sets after the first get a suffix naming the "
                        "flags (write --tenant-flags=',--max-running 8')")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite",
                        help="postgres: the figures of bench/nodes_pg.py instead (one node"
                        " against SQLite, 1-3 nodes, failover; --tasks, --kills, --concurrent"
                        " apply)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work under this directory (kept: node logs, stores)")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.writers, args.kills, args.concurrent = 200, "loop", 2, 12
        args.flood, args.b_tasks, args.b_spread, args.tenant_nodes = 500, 5, 1.0, [1]
        args.tenant_flags = args.tenant_flags.split(",")[0]
    configure_logging("warning")
    runner = run
    if args.store == "postgres":
        from bench.nodes_pg import run_pg as runner
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(runner(args, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="ratchet-nodes-") as tmp:
            results = asyncio.run(runner(args, Path(tmp)))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
