"""How a task actor runs an agent node, one checkpointed turn at a time.

A turn: check the budget → ask the model (retried like a read; recorded in the ledger, keyed
by task, node, visit and turn, by the turn's own commit — so a resumed task never asks a
recorded turn again, and asks the interrupted one at most once more) → validate what it proposes
against the node's tools and their argument schemas (errors go back to the model as tool
results, never as exceptions) → execute through the tool sessions (writes via the ledger)
→ check the loop detectors → commit the new messages and the budget spent in one
transaction. The conversation lives in the task state, one key per message, so each turn
writes only what it added and a resumed agent rebuilds the same conversation.
A final answer must validate against the node's output model (bounded repair attempts).
The model never moves the task: BUDGET_EXHAUSTED and LOOP_DETECTED are runtime outcomes,
routed along declared edges.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from ratchet.actors.agents.loop_detect import LoopPolicy, TurnRecord, detect
from ratchet.actors.agents.models import Message
from ratchet.actors.effects.actions import ActionRunner, TaskSuspended
from ratchet.actors.task import exhausted
from ratchet.actors.task.agent_compact import maybe_compact
from ratchet.actors.task.agent_conversation import Conversation, digest
from ratchet.actors.task.agent_propose import Turn, propose
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import fail_with_saga, suspend
from ratchet.actors.workflow.nodes import FAIL, HUMAN, AgentNode
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import ActionFailed, BudgetExhausted, LoopDetected, RatchetError

__all__ = ["run_agent", "BudgetExhausted"]


def _exhausted(actor: TaskKernel, spent: dict[str, float]) -> str | None:
    assert actor.record is not None
    budget = actor.record.budget
    for dim in ("tokens", "model_calls", "tool_calls", "money"):
        if budget.get(dim) is not None and spent.get(dim, 0) >= budget[dim]:
            return dim
    wall = budget.get("wall_time_s")
    if wall is not None and actor.deps.clock.now() - actor.record.created_at >= wall:
        return "wall_time_s"
    return None


async def run_agent(actor: TaskKernel, node: AgentNode) -> bool:
    """Run one turn; True when the task can go on (another turn, or the next node)."""
    assert actor.record is not None and actor.workflow is not None
    # Each visit of the node is its own conversation (a bounded loop may come back to it).
    visit = actor.visits.get(node.name, 0)
    scope = f"{node.name}#{visit}"
    conv = await _open_conversation(actor, node, scope)
    turn = int(conv.get("turn", 0))
    spent = dict(actor.spent)
    dim = _exhausted(actor, spent)
    if dim is not None or turn >= node.max_turns:
        return await _exhaust(actor, node, conv, spent, dim)
    runner = actor.runner(actor.next_step, None, count_tool_calls=False)  # the turn counts
    if node.compact is not None and not conv.awaits_calls():
        await maybe_compact(actor, node, runner, conv, visit, turn)
        spent = dict(actor.spent)  # with what the summarizer spent
    try:  # a cancel stops the model's answer at once (the turn's tool calls finish first)
        async with actor.open_actions.interruptible(None):
            t = await propose(actor, node, runner, conv, visit, turn, spent)
    except TimeoutError:
        if not actor.open_actions.take_interrupt():
            raise
        await actor.commit(events=[(EventType.STEP_INTERRUPTED, {
            "step": node.name, "index": actor.next_step, "turn": turn})])
        return False  # the cancel is handled next
    if t.exhausted is not None:
        return await _exhaust(actor, node, conv, spent, t.exhausted)
    if t.gave_up is not None:  # every model of the chain failed or declined, none cached
        return await _stop(actor, node, conv, node.degrade.on_exhausted, EventType.AGENT_DEGRADED,
                           {"turn": turn, "answered_by": None, "steps": t.gave_up},
                           RatchetError("no model answered", node=node.name,
                                        steps=t.gave_up))
    # Each outcome below is final when it is True or False; None: the turn commits as usual.
    if not t.proposed.tool_calls:
        outcome = await _take_answer(actor, node, t)
    else:
        outcome = await _run_calls(actor, node, t, runner, scope)
    if outcome is not None:
        return outcome
    return await _end_turn(actor, node, t)


async def _open_conversation(actor: TaskKernel, node: AgentNode, scope: str) -> Conversation:
    """The conversation of this visit of the node: kept by the actor, else read back from
    the agent log, else started with the node's system message and prompt."""
    assert actor.record is not None
    conv: Conversation | None = actor.conversations.get(scope)
    if conv is None:
        conv = Conversation(actor, scope, await actor.deps.store.agent_log(actor.task_id, scope))
        actor.conversations[scope] = conv
    if not conv.messages:
        if node.system:
            conv.add(Message("system", node.system).to_dict())
        conv.add(Message("user", node.prompt(actor.state, actor.record.input)).to_dict())
    return conv


async def _take_answer(actor: TaskKernel, node: AgentNode, t: Turn) -> bool | None:
    """A final answer: valid, it is the node's output and the task moves on (True). Invalid,
    it goes back to the model for repair (None), or past ``repair_attempts`` the task fails
    (False)."""
    conv = t.conv
    try:
        output = node.output.model_validate_json(t.proposed.content or "")
    except ValidationError as exc:
        repairs = int(conv.get("repairs", 0)) + 1
        conv.set("repairs", repairs)
        repair = Message("user", "Your answer did not validate against the required "
                         f"schema {node.output.model_json_schema()}: "
                         f"{exc.errors()[:3]}. Reply with JSON only.").to_dict()
        if repairs > node.repair_attempts:
            error = RatchetError(f"answer failed validation {repairs} times",
                                 node=node.name, problems=str(exc)[:500])
            human = node.on_exhausted == HUMAN
            if human:  # approved, the model gets the repair and its repairs afresh
                conv.set("repairs", 0)
                conv.set("turn", t.number + 1)  # the next turn's model call: a new key
                conv.add(repair)
            await actor.move(node.name, node.name, [*t.events, (EventType.AGENT_TURN, {
                "node": node.name, "turn": t.number, "outcome": "invalid answer"})],
                spend=t.spend, agent_log=conv.flush(), action=t.record, count_visit=False)
            if human:
                await exhausted.to_a_human(actor, node.name, error, "agent answer invalid")
            else:
                await fail_with_saga(actor, error, "agent answer invalid")
            return False
        conv.add(repair)
        t.events.append((EventType.AGENT_REPAIR, {"node": node.name, "turn": t.number,
                                          "attempt": repairs}))
        return None
    actor.state[node.name] = output.model_dump(mode="json")
    conv.set("turn", t.number + 1)
    actor.spent = _add(t.spent, t.spend)
    await actor.move(node.name, node.next, [*t.events, (EventType.AGENT_ANSWERED, {
        "node": node.name, "turn": t.number, "model": t.answered_by,
        "version": t.version, "tokens": t.spend.get("tokens", 0)})], spend=t.spend,
        agent_log=conv.flush(), action=t.record)
    return True


async def _run_calls(actor: TaskKernel, node: AgentNode, t: Turn, runner: ActionRunner,
                     scope: str) -> bool | None:
    """Run the proposed tool calls, then look for a loop: False when the task parked on a
    call, the loop's outcome when the node stops, None when the turn commits as usual."""
    try:
        result, new_artifacts = await _call_tools(actor, node, t, runner)
    except TaskSuspended as signal:
        # Keep the proposal (and what it cost) before parking, so the model is not asked
        # this turn again; the calls run again on resume, answered by the ledger.
        # Tool calls are counted when the turn completes (they run again on resume).
        parked = {k: v for k, v in t.spend.items() if k != "tool_calls"}
        await actor.commit(agent_log=t.conv.pending[:t.upto], action=t.record,
                           spend=parked or None,
                           events=[(EventType.AGENT_TURN, {"node": node.name, "turn": t.number,
                                                   "outcome": "parked"})])
        actor.conversations.pop(scope, None)
        await suspend(actor, signal)
        return False
    return await _check_loop(actor, node, t, result, new_artifacts)


async def _call_tools(actor: TaskKernel, node: AgentNode, t: Turn,
                      runner: ActionRunner) -> tuple[Any, bool]:
    """Run each proposed call and answer it in the conversation; returns the last result,
    and whether any result was new to the conversation."""
    tools = {x.name: x for x in node.tools}
    new_artifacts = False
    result: Any = None
    for call in t.proposed.tool_calls:
        result = await _execute(actor, runner, tools, call.name, call.arguments, t.spent,
                                t.spend)
        new_artifacts = t.conv.see(digest(result)) or new_artifacts
        t.conv.add(Message("tool", json.dumps(result, default=str), tool_call_id=call.id,
                           name=call.name).to_dict())
    return result, new_artifacts


async def _check_loop(actor: TaskKernel, node: AgentNode, t: Turn, result: Any,
                      new_artifacts: bool) -> bool | None:
    """Record the turn for the loop detectors. A loop found: the first time the model is
    told so (None: the turn commits), the next time the node stops along ``on_loop``."""
    conv = t.conv
    proposed = t.proposed
    policy = node.loop or LoopPolicy()
    conv.add_turn(TurnRecord(
        digest([(c.name, c.arguments) for c in proposed.tool_calls]),
        tuple(c.name for c in proposed.tool_calls), new_artifacts,
        result.get(policy.watch_field) if policy.watch_field and isinstance(result, dict)
        else None))
    found = detect(conv.turns[-max(policy.repeat, policy.window, policy.alternation):], policy)
    if found is None:
        return None
    evidence = {"pattern": found.pattern, **found.evidence,
                "history": [x.to_dict() for x in conv.turns[-10:]]}
    if conv.get("intervened"):
        conv.set("turn", t.number + 1)
        await actor.move(node.name, node.name, [(EventType.AGENT_TURN, {
            "node": node.name, "turn": t.number, "outcome": "loop"})], spend=t.spend,
            agent_log=conv.flush(), action=t.record, count_visit=False)
        actor.spent = _add(t.spent, t.spend)
        return await _stop(actor, node, conv, node.on_loop, EventType.AGENT_LOOP_DETECTED, evidence,
                           LoopDetected(f"loop detected: {found.pattern}",
                                        node=node.name, pattern=found.pattern))
    conv.set("intervened", True)
    conv.add(Message("user", f"You are repeating yourself ({found.pattern}). Change"
                     " approach, or give your final answer now.").to_dict())
    t.events.append((EventType.AGENT_INTERVENTION, {"node": node.name, **evidence}))
    return None


async def _end_turn(actor: TaskKernel, node: AgentNode, t: Turn) -> bool:
    """Commit the turn: its messages, the model call's ledger row and what it spent."""
    t.conv.set("turn", t.number + 1)
    t.events.insert(0, (EventType.AGENT_TURN, {
        "node": node.name, "turn": t.number, "model": t.answered_by, "version": t.version,
        "tool_calls": [c.name for c in t.proposed.tool_calls],
        "tokens": t.spend.get("tokens", 0)}))
    await actor.move(node.name, node.name, t.events, spend=t.spend, agent_log=t.conv.flush(),
                     action=t.record, count_visit=False)
    actor.spent = _add(t.spent, t.spend)
    return True


async def _execute(actor: TaskKernel, runner: Any, tools: dict[str, Tool[Any, Any]], name: str,
                   arguments: dict[str, Any], spent: dict[str, float],
                   spend: dict[str, float]) -> Any:
    """Run one proposed call; every refusal is an answer to the model, not an exception."""
    tool = tools.get(name)
    if tool is None:
        return {"error": f"unknown tool {name!r}; allowed: {sorted(tools)}"}
    try:
        args = tool.args.model_validate(arguments)
    except ValidationError as exc:
        return {"error": f"invalid arguments for {name}: {exc.errors()[:3]}"}
    budget = actor.record.budget if actor.record else {}
    if budget.get("tool_calls") is not None and \
            spent.get("tool_calls", 0) + spend.get("tool_calls", 0) >= budget["tool_calls"]:
        return {"error": "tool-call budget exhausted"}
    spend["tool_calls"] = spend.get("tool_calls", 0) + 1
    try:
        result = await runner.call(tool, args)
    except ActionFailed as exc:  # the code too: APPROVAL_REJECTED, CIRCUIT_OPEN, ...
        return {"error": f"{name} failed: {exc.message}", "code": exc.code.value}
    return result.model_dump(mode="json")


async def _exhaust(actor: TaskKernel, node: AgentNode, conv: Conversation,
                   spent: dict[str, float], dim: str | None) -> bool:
    """End the node as budget exhausted (``dim``; None: out of turns)."""
    assert actor.record is not None
    reason = f"budget exhausted: {dim}" if dim else f"no answer in {node.max_turns} turns"
    return await _stop(actor, node, conv, node.on_budget_exhausted,
                       EventType.AGENT_BUDGET_EXHAUSTED,
                       {"dimension": dim or "turns", "spent": spent,
                        "budget": actor.record.budget},
                       BudgetExhausted(reason, node=node.name, dimension=dim or "turns"))


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in set(a) | set(b)}


async def _stop(actor: TaskKernel, node: AgentNode, conv: Conversation, route: str, event: str,
                evidence: dict[str, Any], error: RatchetError) -> bool:
    pending = conv.flush()
    if route == FAIL:
        await actor.commit(events=[(event, {"node": node.name, **evidence})], agent_log=pending)
        await fail_with_saga(actor, error, error.message)
        return False
    await actor.move(node.name, route, [(event, {"node": node.name, **evidence,
                                                 "to": route})], agent_log=pending)
    return True
