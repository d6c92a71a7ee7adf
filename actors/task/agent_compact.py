"""Compacting an agent node's conversation before a turn that would pass its threshold
(actors/agents/compaction.py): one summarizer call, recorded in the ledger and committed
with the compaction entry of the agent log, so a resumed task rebuilds the same view."""

from __future__ import annotations

from ratchet.actors.agents.compaction import (
    SUMMARIZER_SYSTEM,
    Compaction,
    cut_point,
    summary_message,
    transcript,
)
from ratchet.actors.agents.models import Message, ModelRequest
from ratchet.actors.effects.actions import ActionRunner
from ratchet.actors.task.agent_budget import prompt_bound, reserve
from ratchet.actors.task.agent_conversation import Conversation
from ratchet.actors.task.agent_model_call import (
    ModelAnswer,
    ModelCall,
    ledger_row,
    model_tool,
    resolve_model,
)
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.workflow.nodes import AgentNode
from ratchet.protocol.catalogue import EventType

__all__ = ["maybe_compact"]

#: A pinned fact is cut at this length (they are ids and short statements).
MAX_FACT = 500


async def maybe_compact(actor: TaskKernel, node: AgentNode, runner: ActionRunner,
                        conv: Conversation, visit: int, turn: int) -> None:
    """Compact the conversation if the next request would pass ``at_tokens``."""
    policy: Compaction | None = node.compact
    if policy is None or actor.record is None:
        return
    size = prompt_bound(resolve_model(actor, node.model),
                        ModelRequest(conv.view(), [], dict(node.params)))
    if size <= policy.at_tokens:
        return
    head = 2 if conv.messages and conv.messages[0].role == "system" else 1
    start = conv.compaction["upto"] if conv.compaction else head
    cut = cut_point(conv.messages, start, policy.keep_last)
    if cut is None:
        return
    prior = [summary_message(conv.compaction["summary"], [])] if conv.compaction else []
    summarizer = resolve_model(actor, policy.summarizer)
    request = ModelRequest([Message("system", SUMMARIZER_SYSTEM),
                            Message("user", transcript([*prior, *conv.messages[start:cut]]))])
    reserved = reserve(actor.record.budget, actor.spent, summarizer, request)
    if isinstance(reserved, str):
        actor.log.warning("compaction skipped: the budget cannot pay the summarizer",
                          node=node.name, dimension=reserved)
        return
    if reserved is not None and reserved.max_tokens is not None:
        request.params["max_tokens"] = reserved.max_tokens
    asked = ModelCall(key=f"model:{actor.task_id}:{node.name}:{visit}:{turn}:compact",
                      conversation=conv.hash, messages=cut, tools="", params=dict(request.params),
                      model=f"{summarizer.name}:{summarizer.version}")
    answer: ModelAnswer = await runner.call(model_tool(node, summarizer, request), asked)
    pinned = await _pinned(actor, policy)
    conv.compact(head, cut, str(answer.message.get("content") or ""), pinned)
    record = ledger_row(asked, answer, node, actor.next_step)
    record.result = conv.kept(record.result)
    after = prompt_bound(resolve_model(actor, node.model), ModelRequest(conv.view(), [],
                                                                   dict(node.params)))
    await actor.commit(
        agent_log=conv.flush(), action=record,
        spend={"tokens": answer.prompt_tokens + answer.completion_tokens, "model_calls": 1,
               "money": answer.cost},
        events=[(EventType.AGENT_COMPACTED, {
            "node": node.name, "turn": turn, "upto": cut, "messages": len(conv.messages),
            "sent": len(conv.view()), "estimate_before": size, "estimate_after": after,
            "summarizer": asked.model, "pinned": len(pinned)})])


async def _pinned(actor: TaskKernel, policy: Compaction) -> list[str]:
    """Facts the model must keep: the task's effects already taken, then the node's own."""
    assert actor.record is not None
    facts = [f"already done, never to repeat: {a.tool} (key {a.key}"
             + (f", provider id {a.provider_id})" if a.provider_id else ")")
             for a in await actor.deps.store.task_actions(actor.task_id)
             if a.kind == "write" and a.status == "SUCCEEDED"]
    if policy.pinned is not None:
        facts += [str(f) for f in policy.pinned(actor.state, actor.record.input)]
    return [f[:MAX_FACT] for f in facts]
