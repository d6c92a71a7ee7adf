"""Loop and map figures of one node. Prints one JSON object (last line).

- loop_iterations_per_s: one task whose loop node runs 1,000 trivial iterations
  (task.started → task.succeeded, node timestamps);
- steps_per_s: the same 1,000 iterations declared as 1,000 step nodes, for comparison;
- loop_commits_per_iteration: task versions the loop's iterations took (from their events'
  ``aggregate_version``) / iterations: 1.0 means one commit each;
- map_1000_s, map_10000_s: one task mapping over 1,000 (then 10,000: ``MAX_MAP_ITEMS``)
  items, fanout.started → join.completed;
- peak_rss_mb: the node's VmHWM after all that (the 10,000-item map dominates it).

The node is a real ``ratchet serve`` subprocess joined to a real nats-server.
"""

from __future__ import annotations

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
from bench.steps import NodeProc
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.embedded_nats import EmbeddedNats


async def events_of(client: ratchet.Client, workflow: str,
                    input: dict[str, Any] | None = None) -> list[ratchet.Event]:
    task_id = (await client.submit(workflow, input or {}, key=f"{workflow}-{time.time_ns()}")).task_id
    events = [e async for e in client.watch(task_id, idle_timeout=120)]
    assert events[-1].type == "task.succeeded", events[-1]
    return events


def span(events: list[ratchet.Event], first: str, last: str) -> float:
    start = next(e for e in events if e.type == first).occurred_at
    return next(e for e in events if e.type == last).occurred_at - start


async def measure(client: ratchet.Client) -> dict[str, Any]:
    loop = await events_of(client, "loop1000")
    ticks = [e for e in loop if e.type == "step.completed"]
    versions = ticks[-1].aggregate_version - ticks[0].aggregate_version + 1
    steps = await events_of(client, "steps1000")
    mapped = await events_of(client, "map1000")
    widest = await events_of(client, "map1000", {"items": 10_000})
    return {
        "loop_iterations": len(ticks),
        "loop_iterations_per_s": round(len(ticks) / span(loop, "task.started",
                                                         "task.succeeded"), 1),
        "steps_per_s": round(1000 / span(steps, "task.started", "task.succeeded"), 1),
        "loop_commits_per_iteration": round(versions / len(ticks), 3),
        "map_items": 1000,
        "map_1000_s": round(span(mapped, "fanout.started", "join.completed"), 3),
        "map_10000_s": round(span(widest, "fanout.started", "join.completed"), 2),
    }


async def main() -> None:
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="ratchet-dynflow-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        url = await server.start()
        node = NodeProc(Path(tmp) / "node", url, app="bench.dynflow_app:app")
        node.start()
        client = await ratchet.Client.connect(url, "bench", creds=node.creds)
        try:
            results = await measure(client)
            results["peak_rss_mb"] = round(node.status("VmHWM") / 1024, 1)
        finally:
            await client.close()
            node.stop()
            await server.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
