"""The mail that ends a task's wait for the outside world: an accepted action's
confirmation, or the timer that asks the provider when the confirmation is late.

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`); the wait itself begins in
:mod:`actors.task.suspension`.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.effects.actions import ActionRunner, HandoffRequired
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import external_timer_id, is_open_wait, suspend
from ratchet.actors.workflow.tools import Accepted
from ratchet.persistence.ledger import ActionWrite, TimerWrite
from ratchet.protocol.catalogue import EventType, MessageType
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus

__all__ = ["handle_wait_mail", "MAX_PENDING_REARMS"]

#: How many times a still-pending accepted action re-arms its timer before a human decides.
MAX_PENDING_REARMS = 3







# -- mail that ends a wait ---------------------------------------------------------------

async def handle_wait_mail(actor: TaskKernel, env: Envelope) -> str:
    if actor.status is not TaskStatus.WAITING_EXTERNAL:
        return "late"  # late or repeated: never moves a task that has moved on
    body = env.body
    if env.type == MessageType.TIMER_FIRED:
        if body.get("kind") != "external_timeout":
            return "ignored"
        return await external_timeout(actor, env, dict(body.get("payload") or {}))
    key = str(body.get("key", ""))
    cid = str(body.get("correlation_id", key))
    if not await is_open_wait(actor, cid, f"action:{key}"):
        return "ignored"
    action = await actor.deps.store.get_action(actor.record.tenant if actor.record else "", key)
    if action is None or not action.accepted or action.status != "IN_FLIGHT":
        return "ignored"
    tool = actor.deps.registry.tool(action.tool)
    resolved = {"status_event": TaskEvent.EXTERNAL_RESOLVED, "resolve_waits": [cid],
                "cancel_timers": [external_timer_id(actor.task_id, cid)],
                "inbox_message_id": env.message_id}
    if body.get("outcome", "completed") == "completed":  # as for wait nodes
        try:
            result = tool.result.model_validate(body.get("result") or {})
        except Exception as exc:  # a malformed confirmation: keep waiting, say why
            actor.log.warning("invalid confirmation ignored", key=key, error=repr(exc))
            return "invalid"
        await actor.commit(
            action=ActionWrite(key, "SUCCEEDED", result=result.model_dump(mode="json"),
                               provider_id=getattr(result, "provider_id", None)),
            events=[(EventType.ACTION_CONFIRMED, {"key": key, "tool": tool.name})], **resolved)
    else:
        error = {"code": "FAILED", "message": str(body.get("error") or "provider failed")}
        await actor.commit(action=ActionWrite(key, "FAILED", error=error),
                          events=[(EventType.ACTION_FAILED, {"key": key, "tool": tool.name,
                                                     "reason": "provider reported failure",
                                                     "error": error})], **resolved)
    actor.advance()
    return "processed"

async def external_timeout(actor: TaskKernel, env: Envelope, payload: dict[str, Any]) -> str:
    assert actor.record is not None
    key = str(payload.get("key"))
    cid = str(payload.get("correlation_id", key))
    action = await actor.deps.store.get_action(actor.record.tenant, key)
    if action is None:
        return "ignored"
    tool = actor.deps.registry.tool(action.tool)
    runner: ActionRunner = actor.runner(actor.next_step, None)
    ok, value = await runner.query_once(tool, tool.args.model_validate(action.args), key)
    if ok and value is not None and not isinstance(value, Accepted):
        try:
            result = tool.result.model_validate(value)
        except Exception as exc:  # the provider answered outside the contract: a human decides
            await suspend(actor, HandoffRequired("the provider's result failed validation", {
                "why": "invalid provider result", "tool": tool.name, "key": key,
                "error": str(exc)[:500]}))
            return "processed"
        await actor.commit(
            action=ActionWrite(key, "SUCCEEDED", result=result.model_dump(mode="json"),
                               provider_id=getattr(result, "provider_id", None)),
            status_event=TaskEvent.EXTERNAL_RESOLVED, resolve_waits=[cid],
            inbox_message_id=env.message_id,
            events=[(EventType.ACTION_RECONCILED, {"key": key, "found": True,
                                           "after": "confirmation timeout"})])
        actor.advance()
        return "processed"
    rearms = int(payload.get("rearms", 0))
    if ok and isinstance(value, Accepted) and rearms < MAX_PENDING_REARMS:
        timeout = float(payload.get("timeout", 60.0))
        await actor.commit(
            inbox_message_id=env.message_id,
            timers=[TimerWrite(external_timer_id(actor.task_id, cid), "external_timeout",
                               actor.deps.clock.now() + timeout,
                               {**payload, "rearms": rearms + 1})],
            events=[(EventType.ACTION_STILL_PENDING, {"key": key, "rearms": rearms + 1})])
        return "processed"
    why = ("still pending after every re-arm" if ok and value is not None
           else "not found at the provider" if ok else f"query failed: {value}")
    signal = HandoffRequired("confirmation never came", {
        "why": why, "tool": tool.name, "key": key, "request": action.args,
        "provider_id": action.provider_id,
        "options": ["mark the action SUCCEEDED with the provider's result",
                    "mark it FAILED (compensations run)", "resend with the same key"]})
    await suspend(actor, signal)
    return "processed"
