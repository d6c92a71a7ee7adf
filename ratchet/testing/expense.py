"""The seeds' running example: an expense agent that submits claims to a finance system.

Tools talk to the finance-system simulator (``ratchet.testing.finance``) over HTTP with a
blocking client, so they run on their tool session's pykka thread. The finance URL comes
from ``app.resources["finance_url"]`` (set from ``$RATCHET_FINANCE_URL`` at import, or by
whoever builds the node). ``ratchet serve --app ratchet.testing.expense:app`` serves it.

Workflows:
- ``expense.agent``: check the report, submit one claim, report back. The demo drops the
  provider's first response after it committed: the action goes UNKNOWN, is reconciled by
  query, and the task succeeds with exactly one claim at the provider.
- ``expense.split``: two claims (two writes), then an optional step that fails for good
  (``fail_after_writes``): the saga refunds the claims in reverse order; a cancel refunds
  them too. With ``detour`` the hotel step first looks the claim up at the provider and
  does not submit it again if it is there (a re-run that takes another path). The chaos
  harness kills nodes running it, and cancels it during a claim.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.actors.workflow.tools import Accepted, Compensation, RetryPolicy, Tool, ToolContext
from ratchet.testing.finance_client import FinanceClient


class ClaimArgs(BaseModel):
    report_id: str
    part: str = "all"
    employee: str
    amount: float
    currency: str = "EUR"


class ClaimResult(BaseModel):
    provider_id: str
    status: str
    amount: float


class LookupArgs(BaseModel):
    key: str


class LookupResult(BaseModel):
    found: bool
    provider_id: str | None = None


class RefundArgs(BaseModel):
    report_id: str
    part: str
    claim_provider_id: str
    amount: float


class RefundResult(BaseModel):
    provider_id: str
    status: str


@functools.lru_cache(maxsize=8)
def _finance(url: str) -> FinanceClient:
    return FinanceClient(url, timeout=2.0)


def _client(ctx: ToolContext) -> FinanceClient:
    """The finance client for this deployment's URL (built once, not on every call)."""
    return _finance(str(ctx.resources["finance_url"]))


def _chaos_pause() -> None:
    # Widens the window "provider committed, result not yet recorded" for the chaos harness.
    pause = float(os.environ.get("RATCHET_CHAOS_POST_CALL_PAUSE", "0"))
    if pause:
        time.sleep(pause)


def _claim_or_accepted(reply: dict[str, Any]) -> ClaimResult | Accepted:
    if reply.get("status") == "pending":
        return Accepted(provider_id=reply.get("provider_id"), timeout=30.0)
    return ClaimResult(provider_id=reply["provider_id"], status=reply["status"],
                       amount=float(reply.get("amount", 0)))


def _submit_claim(ctx: ToolContext, args: ClaimArgs) -> ClaimResult | Accepted:
    assert ctx.key is not None
    ctx.session["claims_sent"] = int(ctx.session.get("claims_sent", 0)) + 1
    reply = _client(ctx).submit_claim(ctx.key, args.model_dump())
    _chaos_pause()
    return _claim_or_accepted(reply)


def _query_claim(ctx: ToolContext, args: ClaimArgs) -> ClaimResult | Accepted | None:
    assert ctx.key is not None
    found = _client(ctx).query(ctx.key)
    return None if found is None else _claim_or_accepted(found)


def _refund(ctx: ToolContext, args: RefundArgs) -> RefundResult:
    assert ctx.key is not None
    reply = _client(ctx).refund(ctx.key, args.model_dump())
    _chaos_pause()
    return RefundResult(provider_id=reply["provider_id"], status=reply["status"])


def _query_refund(ctx: ToolContext, args: RefundArgs) -> RefundResult | None:
    assert ctx.key is not None
    found = _client(ctx).query(ctx.key)
    if found is None:
        return None
    return RefundResult(provider_id=found["provider_id"], status=found["status"])


def _lookup(ctx: ToolContext, args: LookupArgs) -> LookupResult:
    found = _client(ctx).query(args.key)
    return LookupResult(found=found is not None,
                        provider_id=None if found is None else found.get("provider_id"))


RETRY = RetryPolicy(max_attempts=5, base_delay=0.05, max_delay=1.0)

lookup_claim: Tool[LookupArgs, LookupResult] = Tool(
    "lookup_claim", _lookup, "read", LookupArgs, LookupResult, timeout=3.0, retry=RETRY,
    session="finance")

refund_claim: Tool[RefundArgs, RefundResult] = Tool(
    "refund_claim", _refund, "write", RefundArgs, RefundResult,
    key=lambda a: f"refund:{a.report_id}:{a.part}", timeout=3.0, retry=RETRY,
    query=_query_refund, session="finance")

submit_claim: Tool[ClaimArgs, ClaimResult] = Tool(
    "submit_claim", _submit_claim, "write", ClaimArgs, ClaimResult,
    key=lambda a: f"claim:{a.report_id}:{a.part}:submit", timeout=3.0, retry=RETRY,
    query=_query_claim, session="finance",
    compensate=Compensation(refund_claim, lambda a, r: RefundArgs(
        report_id=a.report_id, part=a.part, claim_provider_id=r.provider_id, amount=a.amount)))


agent = ratchet.Workflow("expense.agent", version=1,
                         description="check an expense report and submit its claim")


@agent.step
async def check_report(ctx: ratchet.StepContext) -> dict[str, Any]:
    items = list(ctx.input.get("items", []))
    if not items:
        raise ValueError("an expense report needs items")
    return {"total": round(sum(float(i["amount"]) for i in items), 2)}


@agent.step
async def submit(ctx: ratchet.StepContext) -> dict[str, Any]:
    claim = await ctx.call(submit_claim, ClaimArgs(
        report_id=ctx.input["report_id"], employee=ctx.input["employee"],
        amount=ctx.state["total"], currency=ctx.input.get("currency", "EUR")))
    return {"claim": claim.model_dump()}


@agent.step
async def report_back(ctx: ratchet.StepContext) -> dict[str, Any]:
    claim = ctx.state["claim"]
    return {"output": {"claim_id": claim["provider_id"], "status": claim["status"],
                       "total": ctx.state["total"]}}


split = ratchet.Workflow("expense.split", version=1, compensate_on_cancel=True,
                         description="two claims for one report, compensated on failure")


@split.step
async def claim_travel(ctx: ratchet.StepContext) -> dict[str, Any]:
    claim = await ctx.call(submit_claim, ClaimArgs(
        report_id=ctx.input["report_id"], part="travel", employee=ctx.input["employee"],
        amount=float(ctx.input["travel"])))
    return {"travel": claim.provider_id}


@split.step
async def claim_hotel(ctx: ratchet.StepContext) -> dict[str, Any]:
    if ctx.input.get("detour"):
        seen = await ctx.call(lookup_claim, LookupArgs(
            key=f"claim:{ctx.input['report_id']}:hotel:submit"))
        if seen.found:  # already there (an earlier attempt): take the other path
            return {"hotel": seen.provider_id}
    claim = await ctx.call(submit_claim, ClaimArgs(
        report_id=ctx.input["report_id"], part="hotel", employee=ctx.input["employee"],
        amount=float(ctx.input["hotel"])))
    return {"hotel": claim.provider_id}


@split.step
async def approve_budget(ctx: ratchet.StepContext) -> dict[str, Any]:
    if ctx.input.get("fail_after_writes"):
        raise ratchet.ActionFailed("budget refused for this report",
                                   report=ctx.input["report_id"])
    return {"output": {"travel": ctx.state["travel"], "hotel": ctx.state["hotel"]}}


app = ratchet.Registry([agent, split], tools=[submit_claim, refund_claim, lookup_claim],
                       resources={"finance_url": os.environ.get("RATCHET_FINANCE_URL", "")})
