"""Figures of nodes on one PostgreSQL store: ``python bench/nodes.py --store postgres
[--quick] [--only single,throughput,failover]``. Progress goes to stderr; bench/nodes.py
prints the JSON object as its last line.

The server is a PostgreSQL 16 of the bench's own (ratchet/testing/pg.py's ``PgServer``:
the ``pgserver`` wheel, a Unix socket, default settings — ``synchronous_commit`` on, so
each commit waits for its WAL flush); each part gets a fresh database of it.

(a) pg_sequential_steps_per_s, pg_concurrent_tasks_per_s (with p50/p99) — bench/steps.py's
    (a) and (b): one task of 1,000 durable steps; 1,000 five-step tasks published at once —
    on one ``ratchet serve`` on PostgreSQL, and the same on one on SQLite in the same run
    (``sqlite_*``, the node's default ``synchronous=FULL``: ``sqlite_synchronous``), with
    ``pg_over_sqlite_sequential`` / ``pg_over_sqlite_concurrent``: the ratios.
(b) pg_tasks_per_s_1/2/3: bench/nodes.py's (a) on PostgreSQL: 1, 2, 3 nodes, --tasks
    five-step tasks published at once, first publish → last ``task.succeeded``. Alongside
    (``pg_throughput_detail_N``): the CPU seconds of each node, of PostgreSQL's processes
    (the postmaster, its backends, those that ended), of the nats-server and of this
    process over the run, and what the nodes' backends were doing, sampled every 50 ms
    from pg_stat_activity (on CPU, waiting on a row lock, on a LWLock or I/O — the WAL
    flush —, or idle in a transaction: waiting for the node's next statement, a round
    trip). ``pg_scaling_bound`` says what bounded the scaling, from those.
(c) pg_failover_p50_s / pg_failover_p99_s: bench/nodes.py's (b) on PostgreSQL (3 nodes,
    lease TTL 5 s, --kills rounds of SIGKILL of a node holding partitions with running
    ``long`` tasks): from the kill to the first step committed by another node after the
    task's ``task.recovered`` (reason ``node_failover``); ``pg_failover_rounds``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench.nodes import failover, say, throughput
from bench.pg_store import node_figures
from bench.pg_view import postmaster_pid
from bench.steps import SYNCHRONOUS
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.testing.pg import PgServer

__all__ = ["run_pg"]


async def single_node(base: Path, pg: PgServer, quick: bool) -> dict[str, Any]:
    """(a): the SQLite node first, then the PostgreSQL one, on one nats-server."""
    nats = EmbeddedNats(base / "nats-single")
    url = await nats.start()
    try:
        out = await node_figures("sqlite", base, url, {}, quick)
        out.update(await node_figures("pg", base, url,
                                      {"RATCHET_STORE": pg.database("single")}, quick))
    finally:
        await nats.stop()
    out["sqlite_synchronous"] = SYNCHRONOUS
    for kind in ("sequential_steps_per_s", "concurrent_tasks_per_s"):
        ratio = out[f"pg_{kind}"] / out[f"sqlite_{kind}"] if out[f"sqlite_{kind}"] else 0.0
        out[f"pg_over_sqlite_{kind.split('_')[0]}"] = round(ratio, 2)
    say(f"one node: pg {out['pg_sequential_steps_per_s']} steps/s, "
        f"{out['pg_concurrent_tasks_per_s']} tasks/s; sqlite (FULL) "
        f"{out['sqlite_sequential_steps_per_s']} steps/s, "
        f"{out['sqlite_concurrent_tasks_per_s']} tasks/s")
    return out


async def scaling(base: Path, pg: PgServer, tasks: int) -> dict[str, Any]:
    """(b): 1, 2, 3 nodes, each count on a fresh database of the one server."""
    out: dict[str, Any] = {}
    runs: dict[int, dict[str, Any]] = {}
    pid = postmaster_pid(pg.pgdata)
    for n in (1, 2, 3):
        say(f"pg throughput: {n} node(s), {tasks} tasks")
        r = await throughput(base / f"pg-tp-{n}", n, tasks, "loop",
                             store_url=pg.database(f"tp{n}_{time.time_ns()}"), pg_pid=pid)
        runs[n] = r
        out[f"pg_tasks_per_s_{n}"] = r["tasks_per_s"]
        out[f"pg_throughput_detail_{n}"] = {k: v for k, v in r.items() if k != "tasks_per_s"}
    out["pg_throughput_tasks"] = tasks
    out.update(scaling_bound(runs, os.cpu_count() or 1))
    return out


def _node_seconds(run: dict[str, Any]) -> float:
    """The CPU seconds of the run's nodes, together."""
    return float(sum(v for k, v in run["cpu_pct"]["seconds"].items()
                     if k not in ("nats", "bench", "postgres")))


def _shares(run: dict[str, Any]) -> dict[str, float]:
    """Of the CPU seconds the run's processes used: each kind's share."""
    seconds = run["cpu_pct"]["seconds"]
    parts = {"nodes": _node_seconds(run), "postgres": seconds.get("postgres", 0.0),
             "nats": seconds["nats"], "bench": seconds["bench"]}
    total = sum(parts.values()) or 1.0
    return {k: round(v / total, 3) for k, v in parts.items()}


def _busy(run: dict[str, Any]) -> dict[str, float]:
    """Of the sampled backends not idle: the share in each state."""
    states = {k: v for k, v in run["pg_backends_mean"].items() if k != "idle"}
    total = sum(states.values()) or 1.0
    return {k: round(v / total, 3) for k, v in states.items()}


def scaling_bound(runs: dict[int, dict[str, Any]], cores: int) -> dict[str, Any]:
    """What bounded 1 → 3 nodes, from the measurements only: the machine's CPU, the
    server's row-lock waits, its WAL flushes, or the round trips inside transactions."""
    top = runs[max(runs)]
    machine, capacity = top["cpu_pct"]["machine"], cores * 100
    busy = _busy(top)
    lock = busy.get("lock_wait", 0.0)
    flush = busy.get("io_wait", 0.0) + busy.get("lwlock_wait", 0.0)
    trips = busy.get("in_txn_waiting_for_node", 0.0)
    cpu = _shares(top)
    if machine >= 0.85 * capacity:
        verdict = f"CPU-bound: the machine was {machine:.0f}% busy of {capacity}%"
    elif lock >= 0.3:
        verdict = f"row-lock-bound: {lock:.0%} of busy backend samples waited on a lock"
    elif flush >= 0.3:
        verdict = f"WAL-flush-bound: {flush:.0%} of busy backend samples waited on I/O/LWLock"
    elif trips >= 0.3:
        verdict = (f"round-trip-bound: {trips:.0%} of busy backend samples were idle in a "
                   "transaction, waiting for the node's next statement")
    else:
        verdict = (f"no single bound saturated (machine {machine:.0f}% of {capacity}%, lock "
                   f"waits {lock:.0%}, I/O {flush:.0%}, in-transaction waits {trips:.0%})")
    per_n = "; ".join(
        f"{n} node(s) {r['tasks_per_s']} tasks/s, machine {r['cpu_pct']['machine']:.0f}%,"
        f" CPU s nodes/pg/nats {_node_seconds(r):.1f}"
        f"/{r['cpu_pct']['seconds'].get('postgres', 0.0):.1f}"
        f"/{r['cpu_pct']['seconds']['nats']:.1f}"
        for n, r in sorted(runs.items()))
    states = (f"busy backends: {trips:.0%} idle in a transaction waiting for their node"
              f" (round trips), {busy.get('cpu', 0.0):.0%} on CPU, {lock:.0%} on row locks,"
              f" {flush:.0%} on I/O or LWLocks (WAL flush)")
    return {"pg_scaling_bound": f"{verdict} at {max(runs)} nodes (CPU share nodes "
                                f"{cpu['nodes']:.0%}, postgres {cpu['postgres']:.0%}, nats "
                                f"{cpu['nats']:.0%}; {states}). {per_n}",
            "pg_scaling_cpu_share_3": cpu, "pg_scaling_backend_states_3": busy,
            "pg_lock_wait_share_3": lock, "pg_machine_cpu_pct_3": machine}


async def run_pg(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """The parts ``--only`` names (``throughput`` means (a) and (b))."""
    wanted = set(args.only.split(","))
    if "throughput" in wanted:
        wanted.add("single")
    results: dict[str, Any] = {"cores": os.cpu_count(), "store": "postgres"}
    with PgServer() as pg:
        if "single" in wanted:
            results.update(await single_node(base, pg, args.quick))
        if "throughput" in wanted:
            results.update(await scaling(base, pg, args.tasks))
        if "failover" in wanted:
            say(f"pg failover: 3 nodes, {args.kills} kills, {args.concurrent} long tasks")
            figures = await failover(base / "pg-failover", args.kills, args.concurrent,
                                     args.seed, store_url=pg.database("failover"))
            results.update({f"pg_{k}": v for k, v in figures.items()})
            results["pg_failover_rounds"] = args.kills
    return results
