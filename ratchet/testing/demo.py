"""``make demo``: the seeds' expense agent on the embedded default.

A private nats-server and a SQLite file under the state directory, the finance-system
simulator as a separate process on loopback, and a task submitted over NATS. The
simulator is told to drop its first response after committing the claim: the runtime does
not mark the claim failed and does not submit it again; it keeps the idempotency key,
reconciles with the finance system, and finishes SUCCEEDED with exactly one claim.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import ratchet
from ratchet.supervisors.node.credentials import admin_key_path
from ratchet.testing import FinanceClient, FinanceSimulatorProcess
from ratchet.testing.expense import app

__all__ = ["run_demo"]


def _say(text: str) -> None:
    print(text, flush=True)


async def run_demo(state_dir: Path, nats_url: str | None = None) -> int:
    """Serve, submit, watch to the end; returns the process exit code."""
    with FinanceSimulatorProcess() as sim:
        finance = FinanceClient(sim.url)
        app.resources["finance_url"] = sim.url
        report_id = f"rep-{int(time.time() * 1000)}"
        key = f"claim:{report_id}:all:submit"
        finance.add_faults([{"op": "claims", "mode": "drop_after_commit", "key": key}])
        _say(f"finance simulator at {sim.url}: its first answer for {key} will be lost "
             "after it commits the claim")
        node = ratchet.Node(ratchet.NodeConfig(state_dir=state_dir / "demo", nats_url=nats_url),
                            app)
        await node.start()
        final, status = None, None
        try:
            assert node.url is not None
            client = await ratchet.Client.connect(node.url, tenant="demo",
                                                  creds=admin_key_path(node.config.state_dir))
            try:
                task_id = (await client.submit("expense.agent", {
                    "report_id": report_id, "employee": "e-1042", "currency": "EUR",
                    "items": [{"what": "train", "amount": 89.5},
                              {"what": "hotel", "amount": 240.0}]}, key=report_id)).task_id
                _say(f"submitted {task_id} over NATS; events:")
                async for event in client.watch(task_id, idle_timeout=30.0):
                    _say(f"  #{event.sequence:<2} {event.type:<18} {json.dumps(event.payload)}")
                    final = event.type
                snapshot = await client.get(task_id)
                status = snapshot.status
                _say(f"status: {status}  output: {json.dumps(snapshot.output)}")
            finally:
                await client.close()
        finally:
            await node.stop()
        claims = finance.effects().get(key, 0)
        _say(f"claims the finance system holds for {key}: {claims}")
    ok = final == "task.succeeded" and status == "SUCCEEDED" and claims == 1
    return 0 if ok else 1
