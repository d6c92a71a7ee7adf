"""An agent turn's proposal: ask the model — or, when the node declares ``degrade``, the
models of its fallback chain, then its answer cache (actors/agents/degrade.py) — within
what the budget can pay for (actors/task/agent_budget.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ratchet.actors.agents.degrade import Degradation, under_pressure
from ratchet.actors.agents.models import Message, Model, ModelRequest
from ratchet.actors.effects.actions import ActionRunner
from ratchet.actors.task.agent_budget import reserve
from ratchet.actors.task.agent_conversation import Conversation, digest
from ratchet.actors.task.agent_model_call import (
    ModelAnswer,
    ModelCall,
    ledger_row,
    model_tool,
    resolve_model,
    tool_specs,
)
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.workflow.nodes import AgentNode
from ratchet.persistence.ledger import ActionWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import ActionFailed

__all__ = ["Turn", "propose"]


@dataclass(slots=True)
class Turn:
    """One turn in progress: what was proposed, by which model, and what it cost so far."""

    conv: Conversation
    number: int
    spent: dict[str, float]  # the task's spending before this turn
    proposed: Message
    answered_by: str = ""
    version: str = ""
    record: ActionWrite | None = None  # the model call's ledger row (None: not asked again)
    spend: dict[str, float] = field(default_factory=dict)  # this turn's, tool calls included
    upto: int = 0  # how many pending agent-log entries belong to the proposal
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    exhausted: str | None = None  # the budget dimension that could not pay for the call
    #: Every model failed or declined and nothing was cached: why, model by model.
    gave_up: list[dict[str, Any]] | None = None


@dataclass(slots=True)
class _Ask:
    """What every candidate of one turn shares."""

    actor: TaskKernel
    node: AgentNode
    runner: ActionRunner
    conv: Conversation
    key: str
    specs_digest: str
    request: ModelRequest


async def propose(actor: TaskKernel, node: AgentNode, runner: ActionRunner,
                  conv: Conversation, visit: int, turn: int, spent: dict[str, float]) -> Turn:
    """Ask for this turn's proposal (a read, recorded by the turn's commit)."""
    assert actor.record is not None
    specs, specs_digest = tool_specs(node)
    if conv.awaits_calls():
        # The proposal was recorded before the task parked on one of its calls (an accepted
        # write, a handoff): run the calls again — the ledger answers for what already
        # happened — and do not ask the model again.
        return Turn(conv, turn, spent, conv.messages[-1])
    ask = _Ask(actor, node, runner, conv, f"model:{actor.task_id}:{node.name}:{visit}:{turn}",
               specs_digest, ModelRequest(conv.view(), specs, dict(node.params)))
    degrade: Degradation | None = node.degrade
    reasons: list[dict[str, Any]] = []
    short: str | None = None
    for model, why in _candidates(actor, node, spent):
        if why:
            reasons.append({"model": _name(model), "reason": why})
        request = replace(ask.request, params=dict(ask.request.params))
        reserved = reserve(actor.record.budget, spent, model, request)
        if isinstance(reserved, str):  # not even an empty answer fits: do not ask it
            short = short or reserved
            reasons.append({"model": _name(model), "reason": f"budget exhausted: {reserved}"})
            continue
        if reserved is not None and reserved.max_tokens is not None:
            request.params["max_tokens"] = reserved.max_tokens  # what the budget can pay for
        asked = ModelCall(key=ask.key, conversation=conv.hash, messages=len(conv.messages),
                          tools=specs_digest, params=dict(request.params),
                          model=f"{model.name}:{model.version}")
        try:
            answer: ModelAnswer = await runner.call(model_tool(node, model, request), asked)
        except ActionFailed as exc:
            if degrade is None:
                raise  # no fallback declared: the task fails as the model did
            reasons.append({"model": _name(model), "reason": f"failed: {exc.code}",
                            "error": exc.message[:300]})
            continue
        used = answer.prompt_tokens + answer.completion_tokens
        over = reserved.overrun(used, answer.cost) if reserved is not None else None
        if over is not None:
            actor.log.warning("model answered past its reservation", node=node.name,
                              reserved_tokens=reserved.tokens if reserved else None, **over)
        if degrade is not None and degrade.cached:
            actor.deps.answers.put(actor.record.tenant, node.name, _digest(ask),
                                   answer.model_dump())
        spend = {"tokens": used, "model_calls": 1, "money": answer.cost}
        return _answered(ask, turn, spent, asked, answer, spend, reasons)
    return _last_resort(ask, turn, spent, reasons, short)


def _candidates(actor: TaskKernel, node: AgentNode,
                spent: dict[str, float]) -> list[tuple[Model, str | None]]:
    """The models to ask in order; with budget pressure, why the node's own is skipped."""
    primary = resolve_model(actor, node.model)
    degrade: Degradation | None = node.degrade
    if degrade is None or not degrade.models:
        return [(primary, None)]
    fallbacks = [resolve_model(actor, m) for m in degrade.models]
    assert actor.record is not None
    dim = under_pressure(degrade.pressure, actor.record.budget, spent)
    if dim is not None:  # the budget runs low: the cheaper models, not the node's own
        return [(fallbacks[0], f"budget pressure: {dim}"), *((m, None) for m in fallbacks[1:])]
    return [(primary, None), *((m, None) for m in fallbacks)]  # each when the one before failed


def _last_resort(ask: _Ask, turn: int, spent: dict[str, float],
                 reasons: list[dict[str, Any]], short: str | None) -> Turn:
    """No model answered: a cached answer to the same request, the budget's outcome, or
    the node's ``on_exhausted`` (``gave_up``)."""
    actor, degrade, last = ask.actor, ask.node.degrade, ask.conv.messages[-1]
    assert actor.record is not None
    if degrade is not None and degrade.cached:
        hit = actor.deps.answers.get(actor.record.tenant, ask.node.name, _digest(ask))
        if hit is not None:
            answer = ModelAnswer.model_validate(hit)
            asked = ModelCall(key=ask.key, conversation=ask.conv.hash,
                              messages=len(ask.conv.messages), tools=ask.specs_digest,
                              params=dict(ask.request.params), model=f"cache:{answer.model}")
            reasons.append({"model": "cache", "reason": "every model failed or declined"})
            return _answered(ask, turn, spent, asked, answer, {}, reasons, cached=True)
    if short is not None and all(r["reason"].startswith("budget") for r in reasons):
        return Turn(ask.conv, turn, spent, last, exhausted=short)
    return Turn(ask.conv, turn, spent, last, gave_up=reasons)


def _answered(ask: _Ask, turn: int, spent: dict[str, float], asked: ModelCall,
              answer: ModelAnswer, spend: dict[str, float], reasons: list[dict[str, Any]],
              cached: bool = False) -> Turn:
    actor, conv = ask.actor, ask.conv
    record = ledger_row(asked, answer, ask.node, actor.next_step)
    record.result = conv.kept(record.result)  # an answer quoting a secret: sealed
    conv.add(answer.message)
    by = f"cache ({answer.model})" if cached else answer.model
    t = Turn(conv, turn, spent, conv.messages[-1], answered_by=by, version=answer.version,
             record=record, spend=spend, upto=len(conv.pending))
    if reasons:  # committed with the turn: who answered instead, and why
        t.events.append((EventType.AGENT_DEGRADED, {"node": ask.node.name, "turn": turn,
                                                    "answered_by": by, "steps": reasons}))
    return t


def _digest(ask: _Ask) -> str:
    """The request as the cache knows it: conversation, tools and the node's parameters
    (not the model, nor the budget's ``max_tokens`` cap)."""
    return digest([ask.conv.hash, ask.specs_digest, dict(ask.node.params)])



def _name(model: Model) -> str:
    return f"{model.name}:{model.version}"
