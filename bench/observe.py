"""Observability figures of one node (``serve --metrics-port``). Prints one JSON object as
its last line.

- metrics_scrape_ms (median of 20) and metrics_scrape_max_ms: one ``GET /metrics`` of a
  node whose store holds 10,000 tasks (10 tenants; 9,000 SUCCEEDED, 500 FAILED, 500
  CANCELLED, each with a spent map), 2,000 ledger actions (20 UNKNOWN), 20 open handoffs
  and 100 dead letters — written into the store before the node starts. Target: < 200 ms.
- sequential_steps_per_s_metrics_off / _on and metrics_cost_pct: bench/steps.py's
  sequential figure (one task of 1,000 trivial steps) on a node without ``--metrics-port``
  and on one with it, scraped once a second meanwhile; three fresh nodes of each, in
  turn, medians compared. node_cpu_us_per_step_metrics_off / _on and
  metrics_cpu_cost_pct: the node process's CPU time per step in the same runs (steadier
  than a rate on a shared machine).

The nodes are real ``ratchet serve`` subprocesses joined to a real nats-server.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.steps import NodeProc, proc_cpu_seconds, sequential
from ratchet.persistence.store import Store
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

TASKS = 10_000
#: Off/on node pairs, and one-task runs of 1,000 steps on each node.
ROUNDS, RUNS = 3, 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def fill_store(state_dir: Path) -> None:
    """A store (migrated by opening it) with TASKS finished tasks and their side rows."""
    state_dir.mkdir(parents=True, exist_ok=True)
    db = state_dir / "ratchet.db"
    await (await Store.open(db)).close()
    now, empty = time.time(), msgpack.packb({})
    statuses = ["SUCCEEDED"] * 18 + ["FAILED", "CANCELLED"]
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany(
            "INSERT INTO tasks(task_id, tenant, workflow, workflow_version, status, version,"
            " idempotency_key, request_hash, input, created_at, updated_at, spent)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(f"t{i:05d}", f"tenant{i % 10}", "seq1000", 1, statuses[i % 20], 3, f"k{i}",
              "h", empty, now - i, now - i,
              msgpack.packb({"tokens": 1200, "money": 0.004, "model_calls": 3}))
             for i in range(TASKS)])
        conn.executemany(
            "INSERT INTO actions(tenant, idempotency_key, task_id, step_index, tool, kind,"
            " request_hash, args, status, seq, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(f"tenant{i % 10}", f"a{i}", f"t{i:05d}", 0, "pay", "write", "h", empty,
              "UNKNOWN" if i % 100 == 0 else "SUCCEEDED", 1, now - i, now - i)
             for i in range(2000)])
        conn.executemany(
            "INSERT INTO handoffs(task_id, reason, package, created_at) VALUES (?,?,?,?)",
            [(f"t{i * 100:05d}", "bench", empty, now - i) for i in range(20)])
        conn.executemany(
            "INSERT INTO dead_letters(subject, error_code, error_message, raw, received_at)"
            " VALUES (?,?,?,?,?)", [("ratchet.submit.x", "INVALID", "bench", b"x", now)] * 100)
    conn.close()


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with session.get(url) as resp:
        return resp.status, await resp.read()


async def scrape_figures(url: str, tmp: Path) -> dict[str, Any]:
    state = tmp / "scrape-node"
    await fill_store(state)
    port = free_port()
    node = NodeProc(state, url, args=("--metrics-port", str(port)))
    node.start()
    times = []
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(20):
                started = time.perf_counter()
                status, body = await get(session, f"http://127.0.0.1:{port}/metrics")
                times.append((time.perf_counter() - started) * 1000)
                assert status == 200, status
        counted = sum(s.value for f in text_string_to_metric_families(body.decode())
                      if f.name == "ratchet_tasks" for s in f.samples)
        assert counted == TASKS, counted  # the scrape read them all
    finally:
        node.stop()
    return {"metrics_scrape_ms": round(statistics.median(times), 2),
            "metrics_scrape_max_ms": round(max(times), 2), "metrics_scrape_tasks": TASKS}


async def steps_with(url: str, state: Path, metrics: bool) -> tuple[float, float]:
    """(sequential steps/s, the node's CPU microseconds per step) on a fresh node."""
    port = free_port()
    node = NodeProc(state, url, args=("--metrics-port", str(port)) if metrics else ())
    node.start()
    assert node.proc is not None
    client = await ratchet.Client.connect(url, "bench", creds=node.creds)
    stop = asyncio.Event()

    async def scraper() -> None:  # what Prometheus does, far more often than it would
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                await get(session, f"http://127.0.0.1:{port}/metrics")
                await asyncio.sleep(1.0)

    scraping = asyncio.create_task(scraper()) if metrics else None
    try:
        cpu = proc_cpu_seconds(node.proc.pid)
        rate = float((await sequential(client, runs=RUNS))["sequential_steps_per_s"])
        return rate, (proc_cpu_seconds(node.proc.pid) - cpu) / (RUNS * 1000) * 1e6
    finally:
        stop.set()
        if scraping is not None:
            await scraping
        await client.close()
        node.stop()


async def figures() -> dict[str, Any]:
    """Every figure of this module (bench/admin.py prints them with its own). On a shared
    machine single runs vary by tens of per cent: off and on alternate, ROUNDS times, and
    the medians are compared; the node's CPU per step is the steadier of the two costs."""
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="ratchet-observe-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        url = await server.start()
        try:
            out = await scrape_figures(url, Path(tmp))
            for i in range(ROUNDS):
                for metrics in (False, True):
                    runs[metrics].append(await steps_with(
                        url, Path(tmp) / f"{metrics}-{i}", metrics))
        finally:
            await server.stop()
    (off, off_cpu), (on, on_cpu) = (
        (statistics.median(r for r, _ in runs[m]), statistics.median(c for _, c in runs[m]))
        for m in (False, True))
    return {**out, "sequential_steps_per_s_metrics_off": round(off, 1),
            "sequential_steps_per_s_metrics_on": round(on, 1),
            "metrics_cost_pct": round((off - on) / off * 100, 1),
            "node_cpu_us_per_step_metrics_off": round(off_cpu, 1),
            "node_cpu_us_per_step_metrics_on": round(on_cpu, 1),
            "metrics_cpu_cost_pct": round((on_cpu - off_cpu) / off_cpu * 100, 1)}


async def main() -> None:
    configure_logging("warning")
    print(json.dumps(await figures()))


if __name__ == "__main__":
    asyncio.run(main())
