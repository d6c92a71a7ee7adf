"""A plain sequential workflow with no side effects: checking an expense report.

``ratchet serve --app examples.report:app`` serves it (the README's first example).
"""

from __future__ import annotations

import asyncio
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
