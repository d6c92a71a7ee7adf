"""Figures of the action protocol against the finance simulator. Prints one JSON object.

- action_overhead_p50_us / _p99_us: a recorded write (ledger IN_FLIGHT commit, the call
  through the node's local tool worker on the session's pykka thread, outcome commit,
  events) minus a direct call of the same tool code, per percentile, over sequential calls;
- actions_per_s: 100 concurrent tasks x 10 writes each, first submit to last success;
- remote_tool_overhead_p50_us: a no-op read tool served by a tool worker in another process
  (``ratchet tool-worker``: request on JetStream, reply on the node's inbox) minus the same
  no-op called in process (the node's local tool worker: the same request and reply
  through a loopback, in its tool session), medians over sequential calls, the two
  alternating call by call in one step (interleaved A/B); the in-process figure beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.remote_noop import NoopArgs, local_noop, remote_noop
from bench.steps import percentile
from ratchet.actors.workflow.tools import ToolContext
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.credentials import admin_key_path
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.testing import FinanceSimulatorProcess
from ratchet.testing.expense import ClaimArgs, _submit_claim, refund_claim, submit_claim

TIMINGS: list[float] = []
NOOP_TIMINGS: dict[str, list[float]] = {"local": [], "remote": []}

calls = ratchet.Workflow("bench.calls", version=1)


@calls.step
async def write_many(ctx: ratchet.StepContext) -> dict[str, Any]:
    for i in range(int(ctx.input["n"])):
        started = time.perf_counter()
        await ctx.call(submit_claim, ClaimArgs(report_id=f"{ctx.input['report']}-{i}",
                                               employee="e", amount=1.0))
        if ctx.input.get("timed"):
            TIMINGS.append(time.perf_counter() - started)
    return {"output": {"n": ctx.input["n"]}}


noops = ratchet.Workflow("bench.noops", version=1)


@noops.step
async def call_noops(ctx: ratchet.StepContext) -> dict[str, Any]:
    for i in range(int(ctx.input["n"])):
        for label, tool in (("local", local_noop), ("remote", remote_noop)):
            started = time.perf_counter()
            await ctx.call(tool, NoopArgs(i=i))
            if i >= 20:  # the first calls warm connections, threads and consumers up
                NOOP_TIMINGS[label].append(time.perf_counter() - started)
    return {"output": {}}


async def _remote_overhead(url: str, client: ratchet.Client, n: int) -> dict[str, Any]:
    """The no-op tool's round trip in process and through a worker process."""
    worker = subprocess.Popen(
        [str(Path(sys.executable).with_name("ratchet")), "--log-level", "warning",
         "tool-worker", "--app", "bench.remote_noop:tools", "--nats-url", url, "--tenant",
         "bench"], cwd=ROOT, stdout=subprocess.PIPE, env={**os.environ})
    try:
        assert worker.stdout is not None
        await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 60)
        task_id = (await client.submit("bench.noops", {"n": n}, key="noops")).task_id
        events = [e async for e in client.watch(task_id, idle_timeout=120)]
        assert events[-1].type == "task.succeeded", events[-1]
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    local, remote = NOOP_TIMINGS["local"], NOOP_TIMINGS["remote"]
    return {
        "remote_tool_overhead_p50_us": round((percentile(remote, 0.5)
                                              - percentile(local, 0.5)) * 1e6),
        "remote_tool_call_p50_us": round(percentile(remote, 0.5) * 1e6),
        "remote_tool_call_p99_us": round(percentile(remote, 0.99) * 1e6),
        "in_process_tool_call_p50_us": round(percentile(local, 0.5) * 1e6),
        "in_process_tool_call_p99_us": round(percentile(local, 0.99) * 1e6),
        "noop_calls_each": len(local),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def _direct_calls(url: str, n: int) -> list[float]:
    ctx = ToolContext("direct", "bench", "submit_claim", None, 1, {}, {"finance_url": url})
    out = []
    for i in range(n):
        ctx.key = f"direct:{i}:{time.time_ns()}"
        started = time.perf_counter()
        _submit_claim(ctx, ClaimArgs(report_id=f"d{i}", employee="e", amount=1.0))
        out.append(time.perf_counter() - started)
    return out


async def main() -> None:
    configure_logging("warning")
    n = 500
    with tempfile.TemporaryDirectory(prefix="ratchet-actions-") as tmp, \
            FinanceSimulatorProcess() as sim:
        server = EmbeddedNats(Path(tmp) / "nats")
        url = await server.start()
        registry = ratchet.Registry([calls, noops], tools=[submit_claim, refund_claim,
                                                           local_noop, remote_noop],
                                    resources={"finance_url": sim.url})
        # 100 tasks run at once (more than the default 64 admission slots).
        node = ratchet.Node(ratchet.NodeConfig(state_dir=Path(tmp) / "node", nats_url=url,
                                               max_running=128),
                            registry)
        await node.start()
        client = await ratchet.Client.connect(url, "bench",
                                              creds=admin_key_path(node.config.state_dir))
        try:
            direct = await asyncio.to_thread(_direct_calls, sim.url, n)
            task_id = (await client.submit("bench.calls", {"n": n, "report": "seq", "timed": True},
                                          key="seq")).task_id
            events = [e async for e in client.watch(task_id, idle_timeout=120)]
            assert events[-1].type == "task.succeeded", events[-1]

            tasks, per_task = 100, 10
            done: set[str] = set()
            finished = asyncio.Event()

            async def on_success(msg: Any) -> None:
                done.add(msg.subject.split(".")[3])
                if len(done) >= tasks:
                    finished.set()

            sub = await client.nc.subscribe("ratchet.events.bench.*.task.succeeded",
                                            cb=on_success)
            started = time.perf_counter()
            for t in range(tasks):
                await client.submit("bench.calls", {"n": per_task, "report": f"c{t}"},
                                    key=f"c{t}")
            await asyncio.wait_for(finished.wait(), 300)
            elapsed = time.perf_counter() - started
            await sub.unsubscribe()
            remote = await _remote_overhead(url, client, 1000 if "--quick" not in sys.argv
                                            else 200)
        finally:
            await client.close()
            await node.stop()
            await server.stop()
    recorded = TIMINGS
    print(json.dumps({
        "action_overhead_p50_us": round((percentile(recorded, 0.5) - percentile(direct, 0.5)) * 1e6),
        "action_overhead_p99_us": round((percentile(recorded, 0.99) - percentile(direct, 0.99)) * 1e6),
        "recorded_call_p50_us": round(statistics.median(recorded) * 1e6),
        "direct_call_p50_us": round(statistics.median(direct) * 1e6),
        "actions_per_s": round(tasks * per_task / elapsed, 1),
        "concurrent_tasks": tasks, "writes_per_task": per_task, **remote,
    }))


if __name__ == "__main__":
    asyncio.run(main())
