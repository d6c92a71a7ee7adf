"""Graph workflows the graph tests serve (in-process, and via ``ratchet serve``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ratchet
from ratchet import END, JoinPolicy


def _branch(name: str) -> ratchet.Workflow:
    wf = ratchet.Workflow(f"branch-{name}")

    @wf.step
    async def work(ctx: ratchet.StepContext) -> dict[str, Any]:
        if ctx.branch in ctx.input.get("fail", []):
            raise RuntimeError(f"branch {ctx.branch} breaks")
        if ctx.branch in ctx.input.get("hang", []):
            await asyncio.Event().wait()  # never finishes
        delay = float(ctx.input.get("slow", {}).get(ctx.branch, ctx.input.get("sleep", 0)))
        if delay:
            await asyncio.sleep(delay)
        path = os.environ.get("RATCHET_TEST_STEP_LOG")
        if path:
            with open(path, "a") as fh:  # noqa: ASYNC230 - one short line, test only
                fh.write(f"{ctx.task_id} branch:{ctx.branch}\n")
        return {"output": {"branch": ctx.branch, "seen": ctx.state.get("seed")}}

    return wf


def fanout_workflow(name: str, branches: list[str], policy: JoinPolicy,
                    branch_timeout: float | None = None) -> ratchet.Workflow:
    wf = ratchet.Workflow(name)
    wf.fanout("spread", {b: _branch(b) for b in branches}, join="gather",
              branch_timeout=branch_timeout, branch_input=lambda state, b: {"seed": b.upper()})
    wf.join("gather", of="spread", policy=policy, next="report")

    @wf.step
    async def report(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"joined": ctx.state["gather"]}}

    return wf


choice = ratchet.Workflow("choice")


@choice.step
async def assess(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"amount": ctx.input["amount"]}


choice.choice("size", guard=lambda s: "auto" if s["amount"] < 100 else "manual",
              targets=["auto", "manual"])


@choice.step(next=END)
async def auto(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"path": "auto"}}


@choice.step(next=END)
async def manual(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"path": "manual"}}


rogue = ratchet.Workflow("rogue")
rogue.choice("pick", guard=lambda s: "nowhere", targets=["fine"])


@rogue.step
async def fine(ctx: ratchet.StepContext) -> None:
    return None


route = ratchet.Workflow("route")


@route.step(name="read")
async def _read_region(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"region": ctx.input.get("region")}


route.route("desk", key=lambda s: s.get("region"), table={"eu": "eu", "us": "us"},
            default="elsewhere")


async def _desk(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"desk": ctx.step_name}}


for _name in ("eu", "us", "elsewhere"):
    route.add_step(_name, _desk, next=END)


approve = ratchet.Workflow("approve")


@approve.step
async def prepare(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"amount": ctx.input["amount"], "resource": "budget-7"}


approve.approval("manager", on_approve="pay", on_reject="declined", timeout=3600,
                 on_timeout="director", approvers="managers",
                 request=lambda s: {"amount": s["amount"], "resource": s["resource"]})
approve.approval("director", on_approve="pay", on_reject="declined", timeout=7200,
                 on_timeout="cancel", approvers="directors",
                 request=lambda s: {"amount": s["amount"], "resource": s["resource"]})


@approve.step(next=END)
async def pay(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": ctx.state["amount"]}}


@approve.step(next=END)
async def declined(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": 0}}


wait = ratchet.Workflow("wait")


@wait.step
async def order(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"order": ctx.input["order"]}


wait.wait("shipped", correlation=lambda s: f"order-{s['order']}", timeout=600, on_timeout="fail",
          next="deliver")


@wait.step
async def deliver(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"tracking": ctx.state["shipped"]["tracking"]}}


loop = ratchet.Workflow("loop")


@loop.step(max_visits=3)
async def attempt(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"tries": ctx.state.get("tries", 0) + 1}


loop.choice("again", guard=lambda s: "attempt" if s["tries"] < int(s.get("goal", 2)) else "done",
            targets=["attempt", "done"])


@loop.step(next=END)
async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"tries": ctx.state["tries"]}}


ABC = ["a", "b", "c"]
app = ratchet.Registry([
    choice, rogue, route, approve, wait, loop,
    fanout_workflow("fan.all", ABC, JoinPolicy("all")),
    fanout_workflow("fan.k", ABC, JoinPolicy("at_least", k=2)),
    fanout_workflow("fan.required", ABC, JoinPolicy("required", required=frozenset({"a"}))),
    fanout_workflow("fan.degrade", ABC, JoinPolicy("all", timeout=10.0,
                                                   defaults={"b": "B?", "c": "C?"})),
    fanout_workflow("fan.budget", ABC, JoinPolicy("required", required=frozenset({"a", "b"})),
                    branch_timeout=5.0),
    fanout_workflow("fan.50", [f"b{i:02d}" for i in range(50)], JoinPolicy("all")),
])
