"""Workflows for bench/trust.py: a payment behind an approval (an hour's timeout), and a
shipment waiting for an external confirmation (ten minutes)."""

from __future__ import annotations

from typing import Any

import ratchet
from ratchet import END

payment = ratchet.Workflow("payment")


@payment.step
async def ask(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"amount": ctx.input.get("amount", 1)}


payment.approval("manager", on_approve="pay", on_reject=END, timeout=3600,
                 on_timeout="cancel", request=lambda s: {"amount": s["amount"]})


@payment.step(next=END)
async def pay(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": ctx.state["amount"]}}


ship = ratchet.Workflow("ship")


@ship.step
async def order(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"order": ctx.input.get("order", 1)}


ship.wait("shipped", correlation=lambda s: f"order-{s['order']}", timeout=600,
          on_timeout="fail", next="done")


@ship.step(next=END)
async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"shipped": ctx.state["order"]}}


quick = ratchet.Workflow("quick")


@quick.step(next=END)
async def only(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"ok": True}}


app = ratchet.Registry([payment, ship, quick])
