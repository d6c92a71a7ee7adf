"""The demo: an expense-report agent as a durable, sequential workflow.

``make demo`` runs :func:`run_demo`: a node on the embedded default (a private
nats-server and a SQLite file under the state directory), a task submitted over NATS, its
events printed as they arrive, exit 0 once it SUCCEEDED.
``ratchet serve --app examples.demo:app`` serves the same workflow.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import ratchet

expense = ratchet.Workflow("expense.report", version=1,
                           description="check an expense report and prepare its claim")


@expense.step
async def load_report(ctx: ratchet.StepContext) -> dict[str, Any]:
    await asyncio.sleep(0.1)  # stands in for reading the report from a document store
    items = ctx.input.get("items", [])
    return {"items": items, "currency": ctx.input.get("currency", "EUR")}


@expense.step
async def check_policy(ctx: ratchet.StepContext) -> dict[str, Any]:
    await asyncio.sleep(0.1)
    limit = 500
    flagged = [i["what"] for i in ctx.state["items"] if i["amount"] > limit]
    return {"flagged": flagged}


@expense.step
async def total(ctx: ratchet.StepContext) -> dict[str, Any]:
    await asyncio.sleep(0.1)
    return {"total": round(sum(i["amount"] for i in ctx.state["items"]), 2)}


@expense.step
async def prepare_claim(ctx: ratchet.StepContext) -> dict[str, Any]:
    await asyncio.sleep(0.1)
    return {"output": {"employee": ctx.input.get("employee"), "total": ctx.state["total"],
                       "currency": ctx.state["currency"], "needs_review": ctx.state["flagged"]}}


app = ratchet.Registry([expense])

DEMO_INPUT = {
    "employee": "e-1042",
    "currency": "EUR",
    "items": [{"what": "train", "amount": 89.5}, {"what": "hotel", "amount": 640.0},
              {"what": "dinner", "amount": 42.3}],
}


async def run_demo(state_dir: Path, nats_url: str | None = None) -> int:
    """Serve, submit, watch to the end; returns the process exit code."""
    node = ratchet.Node(ratchet.NodeConfig(state_dir=state_dir / "demo", nats_url=nats_url), app)
    await node.start()
    try:
        assert node.url is not None
        client = await ratchet.Client.connect(node.url, tenant="demo")
        try:
            key = f"expense-report-{int(time.time() * 1000)}"
            task_id = await client.submit("expense.report", DEMO_INPUT, key)
            print(f"submitted {task_id} (key {key}) over NATS; events:", flush=True)
            final = None
            async for event in client.watch(task_id, idle_timeout=30.0):
                print(f"  #{event.sequence:<2} {event.type:<15} {json.dumps(event.payload)}",
                      flush=True)
                final = event.type
            snapshot = await client.get(task_id)
            print(f"status: {snapshot.status}  output: {json.dumps(snapshot.output)}", flush=True)
        finally:
            await client.close()
    finally:
        await node.stop()
    return 0 if final == "task.succeeded" and snapshot.status == "SUCCEEDED" else 1
