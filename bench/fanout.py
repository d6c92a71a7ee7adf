"""Fan-out and parking figures of one node. Prints one JSON object (last line).

- fanout_join_s: one task fanning out to 1,000 trivial branches, fanout.started to
  join.completed (node timestamps);
- fanout_peak_rss_mb: the node's VmHWM after that;
- parked_rss_mb: the node's VmRSS with 10,000 tasks parked in WAITING_APPROVAL (their
  actors passivated);
- approve_all_s: publishing a decision for each of the 10,000 until every one SUCCEEDED.

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
from bench.steps import NodeProc, publish_submit
from ratchet.protocol.codec import decode_map, encode
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import decision_subject
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

PARKED = 10_000


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
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
