"""The store on PostgreSQL beside SQLite: the same node figures, and group commit measured.
Prints one JSON object as its last line (figures in docs/operations.md, "PostgreSQL").

(a) {sqlite,pg}_sequential_steps_per_s, {sqlite,pg}_concurrent_tasks_per_s (with p50/p99):
    bench/steps.py's (a) and (b) — one task of 1,000 durable steps; 1,000 five-step tasks
    published at once — on one ``ratchet serve`` whose store is the SQLite file (default
    flags) and then on one whose store is a PostgreSQL 16 (``RATCHET_STORE``; the
    ``pgserver`` wheel's server on a Unix socket, default settings: ``synchronous_commit``
    on, so every commit waits for its WAL flush). With each, the node's group-commit
    figures at stop (``*_largest_batch``, ``*_commit_p99_ms``).
(b) pg_changes_per_s_1 / pg_changes_per_s_64: state changes (an event each, CAS on the
    version) made durable per second by one PostgresStore, one at a time and 64 at once
    (64 tasks): what group commit buys — each change waits for a WAL flush
    (persistence/postgres/syncer.py) that covers every commit made before it began; with
    pg_mean_batch_64, the changes per flush.

    python bench/pg_store.py [--quick] [--dsn postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.steps import NodeProc, concurrent, sequential
from ratchet.persistence.store_select import open_store
from ratchet.persistence.txns import NewTask, TaskChange
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.embedded_nats import EmbeddedNats


async def node_figures(prefix: str, base: Path, url: str, env: dict[str, str],
                       quick: bool) -> dict[str, Any]:
    node = NodeProc(base / prefix, url, env=env)
    node.start()
    out: dict[str, Any] = {}
    try:
        client = await ratchet.Client.connect(url, "bench", creds=node.creds)
        try:
            seq = await sequential(client, runs=2 if quick else 5)
            conc = await concurrent(client, n=300 if quick else 1000, rounds=1)
        finally:
            await client.close()
    finally:
        closing = node.stop()
    out[f"{prefix}_sequential_steps_per_s"] = seq["sequential_steps_per_s"]
    for key in ("concurrent_tasks_per_s", "concurrent_p50_s", "concurrent_p99_s"):
        out[f"{prefix}_{key}"] = conc[key]
    for key, value in closing.items():
        if key.startswith("commit_") or key == "largest_batch":
            out[f"{prefix}_{key}"] = value
    return out


async def changes_per_s(dsn: str, parallel: int, seconds: float) -> tuple[float, float]:
    """Changes committed per second with ``parallel`` tasks changing at once; and the mean
    number of changes per transaction."""
    store = await open_store(dsn)
    try:
        run = time.time_ns()
        ids = [f"b{run}-{i}" for i in range(parallel)]
        for task_id in ids:
            await store.accept_submission(NewTask(
                task_id=task_id, tenant="bench", workflow="w", workflow_version=1,
                idempotency_key=task_id, request_hash="h", input=b"\x80", steps_total=None,
                deadline_at=None, now=0.0, producer="bench", message_id=None,
                start_mail=("ratchet.bench", task_id, b"")))
        stats = store.writer_stats
        batches0, txns0 = stats.batches, stats.transactions
        done = 0
        stop_at = time.perf_counter() + seconds

        async def advance(task_id: str) -> None:
            nonlocal done
            version = 1
            while time.perf_counter() < stop_at:
                result = await store.apply(TaskChange(
                    task_id=task_id, expected_version=version, producer="bench", now=1.0,
                    events=[("bench.step", {"v": version})]))
                version = result.version
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(advance(t) for t in ids))
        elapsed = time.perf_counter() - started
        batches = max(1, stats.batches - batches0)
        return done / elapsed, (stats.transactions - txns0) / batches
    finally:
        await store.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dsn", default=None, help="default: a throwaway pgserver")
    args = ap.parse_args()
    configure_logging("warning")
    server = None
    dsn = args.dsn
    if dsn is None:
        import pgserver

        server = pgserver.get_server(tempfile.mkdtemp(prefix="ratchet-pgbench-"),
                                     cleanup_mode="delete")
        dsn = server.get_uri()
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="ratchet-bench-") as tmp:
            base = Path(tmp)
            nats = EmbeddedNats(base / "nats")
            url = await nats.start()
            try:
                results.update(await node_figures("sqlite", base, url, {}, args.quick))
                results.update(await node_figures("pg", base, url, {"RATCHET_STORE": dsn},
                                                  args.quick))
            finally:
                await nats.stop()
        seconds = 2.0 if args.quick else 5.0
        one, _ = await changes_per_s(dsn, 1, seconds)
        many, batch = await changes_per_s(dsn, 64, seconds)
        results.update({"pg_changes_per_s_1": round(one), "pg_changes_per_s_64": round(many),
                        "pg_mean_batch_64": round(batch, 1)})
    finally:
        if server is not None:
            server.cleanup()
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
