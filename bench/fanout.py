"""Fan-out and parking figures of one node. Prints one JSON object (last line).

- fanout_join_s: one task fanning out to 1,000 trivial branches, fanout.started to
  join.completed (node timestamps);
- fanout_peak_rss_mb: the node's VmHWM after that;
- parked_rss_mb: the node's VmRSS with 10,000 tasks parked in WAITING_APPROVAL (their
  actors passivated);
- approve_all_s: publishing a decision for each of the 10,000 until every one SUCCEEDED;
- fanout_100_join_ms_normal / _full: the peer benchmark's W3 on a node of its own (its
  embedded nats-server), ``--synchronous NORMAL`` then ``FULL``: 100 one-step branches
  (``bench.fanout_app``), ``JoinPolicy("all")``, ``max_concurrency`` 100; submit →
  ``task.succeeded`` seen by the client, the median of ``FANOUT_100_RUNS`` runs after a
  warm-up task; ``fanout_100_join_ms`` is the one of the node's default setting
  (``RATCHET_BENCH_SYNCHRONOUS``, as for the other figures); ``fanout_100_node_cpu_ms_*``:
  the node's CPU time per run (mean), which a shared machine disturbs less than the wall;
- fanout_100x10_join_ms, fanout_100x10_node_cpu_ms: the same with branches of ten trivial
  steps (``bench.fan100x10``: 900 branch checkpoints a run), the node's default setting;
- fanout_1000_join_s_1node / _3nodes, fanout_1000_speedup_3nodes,
  fanout_1000_branches_per_node: the 1,000-branch fan-out on one node, then on three
  sharing one store, its branches placed by partition (``bench/fanout_nodes.py``).

The node is a real ``ratchet serve`` subprocess joined to a real nats-server.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench import fanout_nodes
from bench.steps import SYNCHRONOUS, NodeProc, publish_submit
from ratchet.protocol.codec import decode_map, encode
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import decision_subject
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

PARKED = 10_000
FANOUT_100_RUNS = int(os.environ.get("FANOUT_100_RUNS", "9"))


async def fanout(client: ratchet.Client) -> float:
    task_id = (await client.submit("wide", {}, key=f"wide-{time.time_ns()}")).task_id
    events = [e async for e in client.watch(task_id, idle_timeout=120)]
    assert events[-1].type == "task.succeeded", events[-1]
    started = next(e for e in events if e.type == "fanout.started").occurred_at
    joined = next(e for e in events if e.type == "join.completed").occurred_at
    return joined - started


async def park_and_approve(client: ratchet.Client, node: NodeProc) -> dict[str, Any]:
    asked: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    all_asked, all_done = asyncio.Event(), asyncio.Event()

    async def on_event(msg: Any) -> None:
        event = decode_map(msg.data)
        if event["type"] == "approval.requested":
            asked[event["task_id"]] = event["payload"]
            if len(asked) >= PARKED:
                all_asked.set()
        elif event["type"] == "task.succeeded":
            done.add(event["task_id"])
            if len(done) >= PARKED:
                all_done.set()

    sub1 = await client.nc.subscribe(f"ratchet.events.{client.tenant}.*.approval.requested",
                                     cb=on_event)
    sub2 = await client.nc.subscribe(f"ratchet.events.{client.tenant}.*.task.succeeded",
                                     cb=on_event)
    run = time.time_ns()
    futures = []
    for i in range(PARKED):
        futures.append(await publish_submit(client, "parked", f"p-{run}-{i}", {"amount": i}))
    await asyncio.gather(*futures)
    await asyncio.wait_for(all_asked.wait(), 600)
    parked_rss = node.status("VmRSS") / 1024
    started = time.perf_counter()
    futures = []
    for task_id, payload in asked.items():
        env = Envelope(type="approval.decision", message_id=new_id("msg"),
                       correlation_id=payload["approval_id"],
                       body={"task_id": task_id, "approval_id": payload["approval_id"],
                             "decision": "approve", "decided_by": "bench",
                             "request_hash": payload["request_hash"]})
        subject, data = decision_subject(client.tenant), encode(env)
        # Signed as the approver that the local admin key is (docs/security.md).
        futures.append(await client.js.publish_async(subject, data,
                                                     headers=client.sign(subject, data)))
    await asyncio.gather(*futures)
    await asyncio.wait_for(all_done.wait(), 600)
    approve_all = time.perf_counter() - started
    await sub1.unsubscribe()
    await sub2.unsubscribe()
    assert task_id_for(client.tenant, f"p-{run}-0") in asked
    return {"parked_tasks": PARKED, "parked_rss_mb": round(parked_rss, 1),
            "approve_all_s": round(approve_all, 2)}


async def _outcome(client: ratchet.Client, task_id: str) -> str:
    """The task's terminal event type, as soon as the client sees it."""
    async for event in client.watch(task_id, idle_timeout=60):
        if event.type in ("task.succeeded", "task.failed", "task.cancelled"):
            return event.type
    raise RuntimeError(f"task {task_id}: no terminal event")


async def join_100(tmp: Path, synchronous: str, workflow: str = "bench.fan100"
                   ) -> dict[str, float]:
    """W3 on a fresh node of its own: the median submit → ``task.succeeded`` (ms) and the
    node's mean CPU per run (ms). ``workflow``: ``bench.fan100x10`` for ten-step branches
    (which log nothing)."""
    node = NodeProc(tmp / f"w3-{synchronous}-{workflow}", None, app="bench.fanout_app:app",
                    synchronous=synchronous)
    node.start()
    assert node.url is not None
    client = await ratchet.Client.connect(node.url, "bench", creds=node.creds)
    log = str(tmp / f"w3-{synchronous}-{workflow}.log")
    walls, cpus = [], []
    try:
        warm = await client.submit("bench.warm", {}, key=f"warm-{time.time_ns()}")
        assert await _outcome(client, warm.task_id) == "task.succeeded"
        for run in range(FANOUT_100_RUNS):
            cpu0, started = node.cpu_seconds(), time.perf_counter()
            handle = await client.submit(workflow, {"log": log}, key=f"w3-{run}")
            outcome = await _outcome(client, handle.task_id)
            walls.append((time.perf_counter() - started) * 1000)
            cpus.append((node.cpu_seconds() - cpu0) * 1000)
            assert outcome == "task.succeeded", outcome
    finally:
        await client.close()
        node.stop()
    if workflow == "bench.fan100":
        lines = Path(log).read_text().splitlines()
        assert len(lines) == 100 * FANOUT_100_RUNS, len(lines)  # each branch ran once
    return {"ms": round(statistics.median(walls), 1),
            "cpu_ms": round(statistics.fmean(cpus), 1)}


async def main() -> None:
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="ratchet-fanout-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        url = await server.start()
        node = NodeProc(Path(tmp) / "node", url, app="bench.graph_app:app")
        node.start()
        client = await ratchet.Client.connect(url, "bench", creds=node.creds)
        results: dict[str, Any] = {}
        try:
            results["fanout_join_s"] = round(await fanout(client), 3)
            results["fanout_peak_rss_mb"] = round(node.status("VmHWM") / 1024, 1)
            results.update(await park_and_approve(client, node))
        finally:
            await client.close()
            node.stop()
            await server.stop()
        for synchronous in ("NORMAL", "FULL"):
            w3 = await join_100(Path(tmp), synchronous)
            results[f"fanout_100_join_ms_{synchronous.lower()}"] = w3["ms"]
            results[f"fanout_100_node_cpu_ms_{synchronous.lower()}"] = w3["cpu_ms"]
        results["fanout_100_join_ms"] = results[f"fanout_100_join_ms_{SYNCHRONOUS.lower()}"]
        ten = await join_100(Path(tmp), SYNCHRONOUS, "bench.fan100x10")
        results["fanout_100x10_join_ms"] = ten["ms"]
        results["fanout_100x10_node_cpu_ms"] = ten["cpu_ms"]
        results.update(await fanout_nodes.measure(Path(tmp)))
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
