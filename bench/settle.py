"""Settling figures of one in-process node. Prints one JSON object (last line).

- approvals_p50_ms / _p99_ms: round trip of ``admin approvals`` (limit 100) with
  ``--tasks`` tasks (default 300) UNKNOWN on a write whose outcome was lost;
- handoff_p50_ms: round trip of ``admin handoff`` for one of them (the full package);
- resolve_to_succeeded_p50_ms / _p99_ms: ``admin resolve`` sent → the task's
  ``task.succeeded`` seen, for each task in turn (the step runs again and the ledger
  answers it).

The node (ratchet.Node) runs in this process on an embedded nats-server.
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

from pydantic import BaseModel

import ratchet
from bench.steps import percentile
from ratchet.protocol.ids import new_id
from ratchet.protocol.tool_errors import ToolOutcomeUnknown
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.credentials import admin_key_path, ensure_key
from ratchet.supervisors.node.embedded_nats import EmbeddedNats


class Order(BaseModel):
    order: str


class Paid(BaseModel):
    provider_id: str


def _pay(ctx: ratchet.ToolContext, args: Order) -> Paid:
    raise ToolOutcomeUnknown("connection dropped after the request was sent")


pay = ratchet.Tool("pay", _pay, "write", Order, Paid, key=lambda a: f"pay:{a.order}")
wf = ratchet.Workflow("bench.pay", version=1)


@wf.step
async def charge(ctx: ratchet.StepContext) -> dict[str, Any]:
    paid = await ctx.call(pay, Order(order=ctx.task_id))
    return {"output": {"paid": paid.provider_id}}


async def _ask(client: ratchet.Client, verb: str, task_id: str | None = None,
               **args: Any) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    result = await client.request_admin(verb, {"command_id": new_id("cmd"),
                                               "task_id": task_id, "args": args})
    return (time.perf_counter() - started) * 1000, result


async def main(tasks: int) -> None:
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="ratchet-settle-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        url = await server.start()
        state = Path(tmp) / "node"
        ensure_key(admin_key_path(state))
        node = ratchet.Node(ratchet.NodeConfig(state_dir=state, nats_url=url),
                            ratchet.Registry([wf], tools=[pay]))
        await node.start()
        client = await ratchet.Client.connect(url, "bench", creds=admin_key_path(state))
        try:
            ids = [(await client.submit("bench.pay", {}, key=f"o-{i}")).task_id
                   for i in range(tasks)]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                _, listed = await _ask(client, "approvals", limit=1000)
                if len(listed["waiting"]) >= tasks:
                    break
                await asyncio.sleep(0.2)  # polling the node, not waiting on a timer
            listing = [(await _ask(client, "approvals", limit=100))[0] for _ in range(100)]
            handoff = [(await _ask(client, "handoff", ids[0]))[0] for _ in range(50)]
            settle: list[float] = []
            for task_id in ids:
                row = await node.store.get_action("bench", f"pay:{task_id}")  # type: ignore[union-attr]
                assert row is not None
                started = time.perf_counter()
                await client.request_admin("resolve", {
                    "command_id": new_id("cmd"), "task_id": task_id,
                    "args": {"action": row.key, "outcome": "succeeded",
                             "request_hash": row.request_hash, "evidence": "bench",
                             "result": {"provider_id": "p"}}})
                async for event in client.watch(task_id):
                    if event.type == "task.succeeded":
                        break
                settle.append((time.perf_counter() - started) * 1000)
            print(json.dumps({
                "tasks": tasks,
                "approvals_p50_ms": round(percentile(listing, 0.5), 2),
                "approvals_p99_ms": round(percentile(listing, 0.99), 2),
                "handoff_p50_ms": round(percentile(handoff, 0.5), 2),
                "resolve_to_succeeded_p50_ms": round(percentile(settle, 0.5), 2),
                "resolve_to_succeeded_p99_ms": round(percentile(settle, 0.99), 2)}))
        finally:
            await client.close()
            await node.stop()
            await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=300)
    asyncio.run(main(parser.parse_args().tasks))
