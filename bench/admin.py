"""Admin figures of one node. Prints one JSON object (last line).

- admin_get_p50_ms / _p99_ms: round trip of ``admin get`` (200 sequential requests) while
  500 tasks run (all started; 20 steps of 200 ms each, so they are mid-run throughout);
- console_task_page_ms (and _p50_ms, console_task_list_p50_ms): the web console's page of
  that same task, p99 of 100 loads while the 500 run (bench/console.py);
- diagnose_p50_ms / _p99_ms: round trip of ``admin diagnose`` while 500 other tasks run
  (bench/diagnose.py; target p99 < 100 ms), with the statuses the reports gave;
- cancel_100_branches_s: ``admin cancel`` → ``task.cancelled`` for a task with 100 live
  branches that would never finish on their own;
- bench/observe.py's figures: metrics_scrape_ms (10,000 tasks in the store), steps/s and
  the node's CPU per step with metrics off and on.

The node is a real ``ratchet serve`` subprocess joined to a real nats-server.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.console import page_figures
from bench.diagnose import diagnose_figures
from bench.observe import figures as observe_figures
from bench.steps import NodeProc, percentile, publish_submit
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.embedded_nats import EmbeddedNats


async def admin(client: ratchet.Client, verb: str, task_id: str) -> dict[str, Any]:
    return await client.request_admin(verb, {"command_id": new_id("cmd"),
                                             "task_id": task_id})


async def main() -> None:
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="ratchet-admin-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        url = await server.start()
        node = NodeProc(Path(tmp) / "node", url, app="bench.graph_app:app",
                        args=("--console-port", "0", "--max-running", "600"))
        node.start()
        client = await ratchet.Client.connect(url, "bench", creds=node.creds)
        try:
            started_tasks: set[str] = set()
            all_started = asyncio.Event()

            async def on_started(msg: Any) -> None:
                started_tasks.add(msg.subject.split(".")[3])
                if len(started_tasks) >= 500:
                    all_started.set()

            sub = await client.nc.subscribe("ratchet.events.bench.*.task.started", cb=on_started)
            futures = []
            for i in range(500):
                futures.append(await publish_submit(client, "busy", f"busy-{i}"))
            await asyncio.gather(*futures)
            target = task_id_for("bench", "busy-0")
            await asyncio.wait_for(all_started.wait(), 120)  # all 500 are running now
            await sub.unsubscribe()
            rtts = []
            for _ in range(200):
                started = time.perf_counter()
                await admin(client, "get", target)
                rtts.append((time.perf_counter() - started) * 1000)
            rtts.sort()
            console = await page_figures(node, target)  # the same task, in the web console

            hang_id = (await client.submit("hang100", {}, key="hang")).task_id
            async for event in client.watch(hang_id, idle_timeout=60):
                if event.type == "fanout.started":
                    break
            started = time.perf_counter()
            await admin(client, "cancel", hang_id)
            async for event in client.watch(hang_id, idle_timeout=60):
                if event.type == "task.cancelled":
                    break
            cancel_s = time.perf_counter() - started
            diagnosis = await diagnose_figures(client)
        finally:
            await client.close()
            node.stop()
            await server.stop()
    print(json.dumps({
        "admin_get_p50_ms": round(statistics.median(rtts), 2),
        "admin_get_p99_ms": round(percentile(rtts, 0.99), 2),
        "running_tasks": 500, "cancel_100_branches_s": round(cancel_s, 3), **console,
        **diagnosis,
        **await observe_figures(),  # metrics_scrape_ms, metrics on/off (bench/observe.py)
    }))


if __name__ == "__main__":
    asyncio.run(main())
