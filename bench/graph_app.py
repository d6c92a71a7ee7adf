"""Workflows for bench/fanout.py: a 1,000-branch fan-out, and a task that parks for
approval."""

from __future__ import annotations

from typing import Any

import ratchet
from ratchet import END, JoinPolicy

BRANCHES = 1000


def _branch() -> ratchet.Workflow:
    wf = ratchet.Workflow("trivial-branch")

    @wf.step
    async def work(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": 1}

    return wf


wide = ratchet.Workflow("wide")
_one = _branch()
wide.fanout("spread", {f"b{i:04d}": _one for i in range(BRANCHES)}, join="gather")
wide.join("gather", of="spread", policy=JoinPolicy("all"), next=END)

parked = ratchet.Workflow("parked")


@parked.step
async def ask(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"amount": ctx.input.get("amount", 1)}


parked.approval("manager", on_approve="pay", on_reject=END, timeout=86400, on_timeout="cancel",
                request=lambda s: {"amount": s["amount"]})


@parked.step(next=END)
async def pay(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": ctx.state["amount"]}}


hang = ratchet.Workflow("hang100")
_stuck = ratchet.Workflow("stuck-branch")


@_stuck.step
async def stuck(ctx: ratchet.StepContext) -> None:
    import asyncio

    await asyncio.Event().wait()  # never finishes: only a cancel ends it


hang.fanout("spread", {f"b{i:03d}": _stuck for i in range(100)}, join="gather")
hang.join("gather", of="spread", policy=JoinPolicy("all"), next=END)

busy = ratchet.Workflow("busy")  # bench/admin.py: 500 of them run at once, steps of a second
for _i in range(20):
    async def _nap(ctx: ratchet.StepContext) -> None:
        import asyncio

        await asyncio.sleep(1.0)

    busy.add_step(f"s{_i}", _nap)

# bench/diagnose.py: an agent-like task, mid-run for ~100 s (steps of a second: 500 of them
# at once make 500 steps and heartbeats a second, what this 2-core machine sustains).
busy_long = ratchet.Workflow("busy_long")
for _i in range(100):
    async def _beat(ctx: ratchet.StepContext) -> None:
        import asyncio

        await ctx.heartbeat(progress=0.5, note="halfway")
        await asyncio.sleep(1.0)

    busy_long.add_step(f"s{_i}", _beat)

# bench/fanout_nodes.py: 1,000 branches that each wait 50 ms (a tool's or a model's latency),
# at most 64 at once per node (the default max_concurrency, per node).
wide_io = ratchet.Workflow("wide_io")
_waits = ratchet.Workflow("waiting-branch")


@_waits.step
async def waits(ctx: ratchet.StepContext) -> dict[str, Any]:
    import asyncio

    await asyncio.sleep(0.05)
    return {"output": 1}


wide_io.fanout("spread", {f"b{i:04d}": _waits for i in range(BRANCHES)}, join="gather")
wide_io.join("gather", of="spread", policy=JoinPolicy("all"), next=END)

app = ratchet.Registry([wide, wide_io, parked, hang, busy, busy_long])
