"""The ``diagnose_p99_ms`` figure of bench/admin.py: ``admin diagnose`` while 500 tasks run.

500 tasks of ``busy_long`` (bench/graph_app.py: 100 steps of 1 s, each step sending a
``ctx.heartbeat``) are submitted to a node with ``--max-running 600`` (bench/admin.py); once
all 500 run (none finishes within the measurement) 200 of them, spread over all of them,
are diagnosed one after another. The reports' statuses are returned with the figures, so that a run in which the
tasks were not in flight shows it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import ratchet
from bench.steps import percentile, publish_submit
from ratchet.protocol.ids import new_id, task_id_for

__all__ = ["diagnose_figures"]

TASKS, SAMPLES = 500, 200
RUNNING = TASKS  # bench/admin.py starts its node with --max-running 600


async def diagnose_figures(client: ratchet.Client) -> dict[str, Any]:
    """Start the tasks and diagnose 200 of them one after another (the node's stop ends
    the rest)."""
    started: set[str] = set()
    all_started = asyncio.Event()

    async def on_started(msg: Any) -> None:
        started.add(msg.subject.split(".")[3])
        if len(started) >= RUNNING:
            all_started.set()

    sub = await client.nc.subscribe(f"ratchet.events.{client.tenant}.*.task.started",
                                    cb=on_started)
    await asyncio.gather(*[await publish_submit(client, "busy_long", f"long-{i}")
                           for i in range(TASKS)])
    await asyncio.wait_for(all_started.wait(), 120)
    await sub.unsubscribe()
    rtts: list[float] = []
    statuses: dict[str, int] = {}
    for i in range(SAMPLES):
        task_id = task_id_for(client.tenant, f"long-{i * TASKS // SAMPLES}")
        began = time.perf_counter()
        report = await client.request_admin("diagnose", {"command_id": new_id("cmd"),
                                                         "task_id": task_id})
        rtts.append((time.perf_counter() - began) * 1000)
        statuses[report["status"]] = statuses.get(report["status"], 0) + 1
    rtts.sort()
    return {"diagnose_p50_ms": round(statistics.median(rtts), 2),
            "diagnose_p99_ms": round(percentile(rtts, 0.99), 2),
            "diagnosed_statuses": statuses}
