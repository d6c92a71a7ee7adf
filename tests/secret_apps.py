"""Workflows with secrets, for tests/test_redaction.py: an input with a ``SecretStr`` field,
tools with ``SecretStr`` arguments and results, and providers whose errors quote the token
they were given (as real HTTP clients do).

What the tools saw in clear is appended to :data:`SEEN` (tool name, clear token).
"""

from __future__ import annotations

import json
from typing import Any

import structlog
from pydantic import BaseModel

import ratchet
from ratchet.actors.agents.models import ModelRequest
from ratchet.actors.agents.scripted_model import Reply, ScriptedModel, reply
from ratchet.protocol.errors import ToolInvalidArgument, ToolOutcomeUnknown, ToolTransient

#: (tool, the clear token it was called with), in call order.
SEEN: list[tuple[str, str]] = []
#: Tokens whose first call fails with a transient error quoting them.
FLAKY: set[str] = set()
#: The first user message (the prompt) of every model call.
PROMPTS: list[str] = []

log = structlog.get_logger("tests.secret_apps")


class SignupInput(BaseModel):
    customer: str
    api_key: ratchet.SecretStr


class ChargeArgs(BaseModel):
    customer: str
    token: ratchet.SecretStr


class ChargeResult(BaseModel):
    provider_id: str
    receipt: ratchet.SecretStr


def _called(name: str, args: ChargeArgs) -> str:
    clear = args.token.get_secret_value()
    SEEN.append((name, clear))
    # A careless tool: its log line and its errors quote the token.
    log.info(f"calling the provider with {clear}", tool=name, args=args)
    return clear


@ratchet.tool(kind="write", args=ChargeArgs, result=ChargeResult,
              key=lambda a: f"charge:{a.customer}")
async def charge(ctx: ratchet.ToolContext, args: ChargeArgs) -> ChargeResult:
    """Charge a customer with their API key; flaky once for the tokens in FLAKY."""
    clear = _called("charge", args)
    ctx.session["token"] = args.token  # a session keeps it (sealed in tool_sessions)
    if clear in FLAKY:
        FLAKY.discard(clear)
        raise ToolTransient(f"HTTP 503 for Authorization: Bearer {clear}")
    return ChargeResult(provider_id=f"ch-{args.customer}",
                        receipt=ratchet.SecretStr(f"rcpt-{clear}"))


@ratchet.tool(kind="write", args=ChargeArgs, result=ChargeResult,
              key=lambda a: f"lost:{a.customer}")
async def lost(ctx: ratchet.ToolContext, args: ChargeArgs) -> ChargeResult:
    """A provider that drops the connection: the outcome is unknown, and there is no query."""
    clear = _called("lost", args)
    raise ToolOutcomeUnknown(f"connection reset after sending token {clear}")


@ratchet.tool(kind="write", args=ChargeArgs, result=ChargeResult,
              key=lambda a: f"refused:{a.customer}")
async def refused(ctx: ratchet.ToolContext, args: ChargeArgs) -> ChargeResult:
    """A provider that refuses the key for good, quoting it."""
    clear = _called("refused", args)
    raise ToolInvalidArgument(f"HTTP 400: key {clear} is not valid for this account")


def _signup(name: str, tool: ratchet.Tool[Any, Any]) -> ratchet.Workflow:
    wf = ratchet.Workflow(name, version=1, input_model=SignupInput)

    @wf.step
    async def prepare(ctx: ratchet.StepContext) -> dict[str, Any]:
        key = ctx.input["api_key"]
        assert isinstance(key, ratchet.SecretStr)
        ctx.log.info("preparing", api_key=key, clear=f"the key is {key.get_secret_value()}")
        # The secret is kept in the state: sealed in the checkpoint.
        return {"customer": ctx.input["customer"], "key": key}

    @wf.step
    async def pay(ctx: ratchet.StepContext) -> dict[str, Any]:
        result = await ctx.call(tool, {"customer": ctx.state["customer"],
                                       "token": ctx.state["key"]})
        return {"receipt": result.receipt, "provider_id": result.provider_id}

    @wf.step
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"paid": ctx.state["provider_id"], "receipt": ctx.state["receipt"]}}

    return wf


signup = _signup("signup", charge)
signup_lost = _signup("signup.lost", lost)
signup_refused = _signup("signup.refused", refused)

#: Parks between storing the secret and using it: a new node must open the checkpoint.
held = ratchet.Workflow("signup.held", version=1, input_model=SignupInput)


@held.step
async def keep(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"customer": ctx.input["customer"], "key": ctx.input["api_key"]}


held.wait("hold", correlation=lambda s: f"go-{s['customer']}", timeout=3600, on_timeout="fail")


@held.step
async def use(ctx: ratchet.StepContext) -> dict[str, Any]:
    result = await ctx.call(charge, {"customer": ctx.state["customer"], "token": ctx.state["key"]})
    return {"output": {"paid": result.provider_id}}




class Paid(BaseModel):
    paid: str


def _clerk(request: ModelRequest) -> Reply:
    """A model that reads the key from its prompt and echoes it in a tool call."""
    prompt = next(m.content or "" for m in request.messages if m.role == "user")
    PROMPTS.append(prompt)
    if not any(m.role == "tool" for m in request.messages):
        return reply(tool_calls=[("charge", {"customer": "c8", "token": prompt.split()[-1]})])
    return reply(json.dumps({"paid": "ch-c8"}))


#: An agent whose prompt holds the clear key (the model must have it to use it).
agent = ratchet.Workflow("signup.agent", version=1, input_model=SignupInput)
agent.agent("clerk", model=ScriptedModel(_clerk), tools=[charge], output=Paid,
            prompt=lambda state, input: f"Charge {input['customer']} with the key"
                                        f" {input['api_key'].get_secret_value()}")

#: Asks a human, showing the key (redacted) in the approval request.
approved = ratchet.Workflow("signup.approved", version=1, input_model=SignupInput)


@approved.step
async def ask(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"customer": ctx.input["customer"], "key": ctx.input["api_key"]}


approved.approval("check", on_approve=ratchet.END, on_reject=ratchet.END, timeout=3600,
                  on_timeout="cancel", request=lambda s: {"customer": s["customer"],
                                                          "key": s["key"]})

app = ratchet.Registry([signup, signup_lost, signup_refused, held, agent, approved])
