"""Remote tools the tests call (node side: :data:`app`) and serve (worker side:
``ratchet tool-worker --app tests.tool_apps:worker_tools``).

``pay`` files a claim at the finance simulator (``$RATCHET_FINANCE_URL``) under the
action's idempotency key; with ``$RATCHET_TOOL_DIE_AFTER_EFFECT`` set (``1``, or the one
invoice to die on), the worker SIGKILLs itself right after the simulator committed the
claim, before any reply.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.testing.finance_client import FinanceClient


class EchoArgs(BaseModel):
    text: str


class EchoResult(BaseModel):
    text: str
    pid: int


class PayArgs(BaseModel):
    invoice: str
    amount: float


class PayResult(BaseModel):
    provider_id: str
    status: str


echo = ratchet.remote_tool("echo", kind="read", args=EchoArgs, result=EchoResult, timeout=10.0)
pay = ratchet.remote_tool(
    "pay", kind="write", args=PayArgs, result=PayResult,
    key=lambda a: f"invoice:{a.invoice}:pay", timeout=3.0, has_query=True,
    retry=ratchet.RetryPolicy(max_attempts=10, base_delay=0.2, max_delay=1.0))

calls = ratchet.Workflow("remote.echo", version=1)


@calls.step
async def call_echo(ctx: ratchet.StepContext) -> dict[str, Any]:
    result = await ctx.call(echo, EchoArgs(text=str(ctx.input["text"])))
    return {"output": {"text": result.text, "pid": result.pid}}


payment = ratchet.Workflow("remote.pay", version=1)


@payment.step
async def call_pay(ctx: ratchet.StepContext) -> dict[str, Any]:
    result = await ctx.call(pay, PayArgs(invoice=str(ctx.input["invoice"]), amount=12.5))
    return {"output": {"provider_id": result.provider_id}}


#: ``pay`` with a timeout longer than a dying worker's redelivery: the next worker's call,
#: a replay at the provider under the same key, answers the node before it gives up.
pay_patient = ratchet.remote_tool(
    "pay_patient", kind="write", args=PayArgs, result=PayResult,
    key=lambda a: f"invoice:{a.invoice}:pay", timeout=30.0, has_query=True)

#: ``pay`` in a session pinned to the worker that took it (tests/test_pinned_liveness.py).
pay_pinned = ratchet.remote_tool(
    "pay_pinned", kind="write", args=PayArgs, result=PayResult,
    key=lambda a: f"invoice:{a.invoice}:pay", timeout=8.0, has_query=True, session="till",
    retry=ratchet.RetryPolicy(max_attempts=5, base_delay=0.1, max_delay=0.5))

slow = ratchet.remote_tool("slow", kind="read", args=EchoArgs, result=EchoResult, timeout=30.0)
refuse = ratchet.remote_tool("refuse", kind="write", args=PayArgs, result=PayResult,
                             key=lambda a: f"invoice:{a.invoice}:refuse")


def _calling(name: str, tool: ratchet.Tool[Any, Any], args: Any) -> ratchet.Workflow:
    wf = ratchet.Workflow(name, version=1)

    async def call(ctx: ratchet.StepContext) -> dict[str, Any]:
        result = await ctx.call(tool, args)
        return {"output": result.model_dump()}

    wf.add_step("call", call)
    return wf


app = ratchet.Registry([calls, payment, _calling("remote.slow", slow, EchoArgs(text="s")),
                        _calling("remote.refuse", refuse, PayArgs(invoice="r", amount=1)),
                        _calling("remote.pay_patient", pay_patient,
                                 PayArgs(invoice="patient", amount=12.5))],
                       tools=[echo, pay, slow, refuse, pay_patient])


# -- the worker's side ------------------------------------------------------------------

def _echo(ctx: ratchet.ToolContext, args: EchoArgs) -> EchoResult:
    return EchoResult(text=args.text, pid=os.getpid())


def _finance() -> FinanceClient:
    return FinanceClient(os.environ["RATCHET_FINANCE_URL"], timeout=2.0)


def _pay(ctx: ratchet.ToolContext, args: PayArgs) -> PayResult:
    assert ctx.key is not None
    reply = _finance().submit_claim(ctx.key, {"report_id": args.invoice, "employee": "e",
                                              "amount": args.amount})
    if os.environ.get("RATCHET_TOOL_DIE_AFTER_EFFECT") in ("1", args.invoice):
        os.kill(os.getpid(), signal.SIGKILL)  # the effect is committed; no reply leaves
    return PayResult(provider_id=reply["provider_id"], status=reply["status"])


def _query_pay(ctx: ratchet.ToolContext, args: PayArgs) -> PayResult | None:
    assert ctx.key is not None
    found = _finance().query(ctx.key)
    return None if found is None else PayResult(provider_id=found["provider_id"],
                                                status=found["status"])


worker_tools = [ratchet.served_by(echo, _echo), ratchet.served_by(pay, _pay, _query_pay)]
patient_tools = [ratchet.served_by(pay_patient, _pay, _query_pay)]
pinned_tools = [ratchet.served_by(pay_pinned, _pay, _query_pay)]
