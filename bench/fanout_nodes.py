"""A 1,000-branch fan-out on one node, then on three. Prints one JSON object (last line).

- fanout_1000_join_s_1node: one ``ratchet serve`` on its own store, the ``wide`` workflow of
  ``bench.graph_app`` (1,000 one-step trivial branches, ``JoinPolicy("all")``):
  ``fanout.started`` to ``join.completed`` (node timestamps), the median of
  ``FANOUT_NODES_RUNS`` tasks after a warm-up one;
- fanout_1000_join_s_3nodes: the same with three ``serve`` processes on one store and one
  nats-server (each node holding some of the 16 partitions, e.g. 6/6/4): each branch runs on the owner of the partition
  its id hashes to, so the task's node runs about a third of them and the others get theirs
  by ``branch.start`` mail; ``fanout_1000_branches_per_node``: where the last run's
  branches ran (``ran_on`` of their ``branch.completed`` events);
- fanout_1000_speedup_3nodes: 1node / 3nodes;
- fanout_1000x50ms_join_s_1node / _3nodes, fanout_1000x50ms_speedup_3nodes: the same with
  ``wide_io``, branches that each wait 50 ms (a tool's latency; at most 64 of a fan-out's
  branches run at once on each node, the default when a fan-out sets no ``max_concurrency``).

Every node is a real subprocess; on this 2-core machine three nodes share two cores and one
SQLite file, so the figure says what placement costs or gains there, not on three hosts.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgpack

import ratchet
from bench.steps import NodeProc
from ratchet.persistence.leases import HostLeaseClock
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

RUNS = int(os.environ.get("FANOUT_NODES_RUNS", "3"))


def _db(state: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{state / 'ratchet.db'}?mode=ro", uri=True, timeout=30)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


async def _balanced(state: Path, count: int) -> None:
    """Until ``count`` nodes hold live leases on all 16 partitions (bounded: 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        conn = _db(state)
        try:
            owners = Counter(o for (o,) in conn.execute(
                "SELECT owner FROM leases WHERE expires_at > ?", (HostLeaseClock().now(),)))
        finally:
            conn.close()
        if len(owners) == count and sum(owners.values()) == 16:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"partitions not shared by {count} nodes in 60 s")


async def _one(client: ratchet.Client, tag: str, workflow: str = "wide") -> tuple[float, str]:
    """One ``wide`` task, followed with ``client.watch``: ``fanout.started`` →
    ``join.completed`` by the node timestamps. With branches on several nodes the task's
    events come from several outbox relays, out of order; the watch yields them in sequence
    order (actors/transport/event_watch.py): every one, checked here."""
    task_id = (await client.submit(workflow, {}, key=f"{tag}-{time.time_ns()}")).task_id
    events = [e async for e in client.watch(task_id, idle_timeout=120)]
    assert events[-1].type == "task.succeeded", events[-1]
    assert [e.sequence for e in events] == list(range(1, len(events) + 1)), "a gap"
    started = next(e for e in events if e.type == "fanout.started").occurred_at
    joined = next(e for e in events if e.type == "join.completed").occurred_at
    return joined - started, task_id


def _ran_on(state: Path, task_id: str) -> dict[str, int]:
    conn = _db(state)
    try:
        return dict(Counter(msgpack.unpackb(p).get("ran_on") for (p,) in conn.execute(
            "SELECT payload FROM events WHERE task_id = ? AND type = 'branch.completed'",
            (task_id,))))
    finally:
        conn.close()


async def fan_1000(tmp: Path, url: str, count: int) -> dict[str, Any]:
    """The median fan-out of ``RUNS`` tasks on ``count`` nodes sharing one store."""
    state = tmp / f"nodes-{count}"
    nodes = [NodeProc(state, url, app="bench.graph_app:app",
                      args=("--node-id", f"n{i + 1}")) for i in range(count)]
    for node in nodes:
        node.start()
    client = await ratchet.Client.connect(url, "bench", creds=nodes[0].creds)
    try:
        await _balanced(state, count)
        await _one(client, f"warm{count}")
        times, waits, task_id = [], [], ""
        for run in range(RUNS):
            took, task_id = await _one(client, f"n{count}-{run}")
            times.append(took)
            waits.append((await _one(client, f"io{count}-{run}", "wide_io"))[0])
        return {"s": round(statistics.median(times), 3), "where": _ran_on(state, task_id),
                "io_s": round(statistics.median(waits), 3)}
    finally:
        await client.close()
        for node in nodes:
            node.stop()


async def _on_own_nats(tmp: Path, count: int) -> dict[str, Any]:
    server = EmbeddedNats(tmp / f"nats-{count}")  # streams and consumers of its own
    url = await server.start()
    try:
        return await fan_1000(tmp, url, count)
    finally:
        await server.stop()


async def measure(tmp: Path) -> dict[str, Any]:
    one = await _on_own_nats(tmp, 1)
    three = await _on_own_nats(tmp, 3)
    return {"fanout_1000_join_s_1node": one["s"], "fanout_1000_join_s_3nodes": three["s"],
            "fanout_1000_speedup_3nodes": round(one["s"] / three["s"], 2),
            "fanout_1000x50ms_join_s_1node": one["io_s"],
            "fanout_1000x50ms_join_s_3nodes": three["io_s"],
            "fanout_1000x50ms_speedup_3nodes": round(one["io_s"] / three["io_s"], 2),
            "fanout_1000_branches_per_node": three["where"]}


async def main() -> None:
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="ratchet-fanout-nodes-") as tmp:
        results = await measure(Path(tmp))
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
