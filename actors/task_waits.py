"""How a task actor stops and resumes around the outside world: suspension (waiting for a
confirmation, or for a human), the mail that ends a wait, and failure with compensation.
(The crash-loop guard on recovery is in :mod:`actors.crash_loop`.)

Functions over a :class:`actors.task_actor.TaskActor`, kept apart so that each module holds
one concept; every one runs in the task actor's own asyncio task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratchet.actors.actions import (
    ActionRunner,
    AwaitExternal,
    HandoffRequired,
    PauseRequested,
    TaskSuspended,
)
from ratchet.actors.saga import compensate_task
from ratchet.actors.tools import Accepted
from ratchet.persistence.ledger import ActionRecord, ActionWrite, TimerWrite
from ratchet.protocol.errors import ActionFailed
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus

if TYPE_CHECKING:
    from ratchet.actors.task_actor import TaskActor

__all__ = ["suspend", "handoff_package", "fail_with_saga", "handle_wait_mail",
           "MAX_PENDING_REARMS", "unresolved_actions"]

#: How many times a still-pending accepted action re-arms its timer before a human decides.
MAX_PENDING_REARMS = 3


def _timer_id(task_id: str, correlation_id: str) -> str:
    return f"ext:{task_id}:{correlation_id}"


async def suspend(actor: TaskActor, signal: TaskSuspended) -> None:
    """Record why the task cannot go on, then passivate (stop this actor)."""
    if isinstance(signal, PauseRequested):
        from ratchet.actors.task_control import pause

        await pause(actor, before_tool=signal.tool)
        return
    if isinstance(signal, AwaitExternal):
        due = actor.deps.clock.now() + signal.timeout
        await actor.commit(
            status_event=TaskEvent.WAITING_EXTERNAL,
            waits=[(signal.correlation_id, f"action:{signal.key}")],
            timers=[TimerWrite(_timer_id(actor.task_id, signal.correlation_id),
                               "external_timeout", due,
                               {"key": signal.key, "correlation_id": signal.correlation_id,
                                "rearms": 0, "timeout": signal.timeout})],
            events=[("task.waiting_external", {"key": signal.key,
                                               "correlation_id": signal.correlation_id,
                                               "timeout_s": signal.timeout})])
        actor.log.info("task waiting for a confirmation", correlation_id=signal.correlation_id)
    elif isinstance(signal, HandoffRequired):
        package = await handoff_package(actor, signal)
        event = TaskEvent.WAITING_APPROVAL if signal.approval else TaskEvent.OUTCOME_UNKNOWN
        await actor.commit(
            status_event=event, handoff=(signal.reason, package),
            events=[("task.handoff" if signal.approval else "task.unknown",
                     {"reason": signal.reason, "why": package.get("why"),
                      "key": package.get("key")})])
        actor.log.warning("task handed to a human", reason=signal.reason, status=actor.status)
    actor.ref.stop()

async def handoff_package(actor: TaskActor, signal: HandoffRequired) -> dict[str, Any]:
    """Everything a human needs: goal, timeline, last checkpoint, requests, provider ids,
    and the options they have."""
    assert actor.record is not None
    events = await actor.deps.store.events(actor.task_id)
    actions = await actor.deps.store.task_actions(actor.task_id)
    return {
        **signal.package,
        "goal": {"workflow": actor.record.workflow, "input": actor.record.input},
        "timeline": [{"sequence": e["sequence"], "type": e["type"], "at": e["occurred_at"],
                      "payload": e["payload"]} for e in events[-50:]],
        "last_checkpoint": {"seq": actor.record.last_checkpoint, "next_step": actor.next_step,
                            "state_keys": sorted(actor.state)},
        "actions": [{"key": a.key, "tool": a.tool, "status": a.status,
                     "provider_id": a.provider_id, "attempts": a.attempts,
                     "request": a.args} for a in actions],
    }

async def fail_with_saga(actor: TaskActor, cause: BaseException, reason: str) -> None:
    """Compensate completed side effects in reverse order, then end FAILED.

    A write whose outcome is not known (IN_FLIGHT or UNKNOWN: the step gave up while it was
    in flight) must not be forgotten by a FAILED: the task goes UNKNOWN with a handoff
    naming it instead — a human decides, nothing is compensated or resent blindly."""
    from ratchet.actors.task_actor import error_of

    actions = await actor.deps.store.task_actions(actor.task_id)
    unresolved = unresolved_actions(actions)
    if unresolved:
        await suspend(actor, HandoffRequired("the task failed with side effects of unknown"
                                             " outcome", {
            "why": "unresolved actions at failure", "failure": error_of(cause, reason),
            "key": unresolved[0].key,
            "unresolved": [{"key": a.key, "tool": a.tool, "status": a.status}
                           for a in unresolved],
            "options": ["reconcile each action with the provider, then fail the task",
                        "mark them done and resume"]}))
        return
    runner = actor.runner(actor.next_step, None, task_deadline=False, count_tool_calls=False)
    try:
        compensated = await compensate_task(runner, actor.deps.store, actor.deps.registry,
                                            actor.task_id, actions)
    except HandoffRequired as signal:
        await suspend(actor, signal)
        return
    except TaskSuspended as signal:  # a compensation that must wait: a human decides
        await suspend(actor, HandoffRequired("a compensation is waiting for its provider", {
            "why": "compensation accepted but not confirmed", "detail": str(signal)},
            approval=True))
        return
    except ActionFailed as exc:  # pragma: no cover - compensate_task turns these into handoffs
        await suspend(actor, HandoffRequired(str(exc), {"why": str(exc)}, approval=True))
        return
    error = error_of(cause, reason)
    await actor.commit(status_event=TaskEvent.FAILED, error=error,
                      events=[("task.failed", {"reason": reason, "error": error,
                                               "compensated": compensated})])
    actor.log.warning("task failed", reason=reason, compensated=compensated)
    actor.ref.stop()

def unresolved_actions(actions: list[ActionRecord]) -> list[ActionRecord]:
    """Writes whose outcome is not known. Compensations in flight are not in doubt: the saga
    reconciles them."""
    return [a for a in actions if a.status in ("IN_FLIGHT", "UNKNOWN") and not a.accepted
            and a.compensates is None]

# -- mail that ends a wait ---------------------------------------------------------------

async def handle_wait_mail(actor: TaskActor, env: Envelope) -> str:
    if actor.status is not TaskStatus.WAITING_EXTERNAL:
        return "late"  # late or repeated: never moves a task that has moved on
    body = env.body
    if env.type == "timer.fired":
        if body.get("kind") != "external_timeout":
            return "ignored"
        return await external_timeout(actor, env, dict(body.get("payload") or {}))
    key = str(body.get("key", ""))
    action = await actor.deps.store.get_action(actor.record.tenant if actor.record else "", key)
    if action is None or not action.accepted or action.status != "IN_FLIGHT":
        return "ignored"
    tool = actor.deps.registry.tool(action.tool)
    cid = str(body.get("correlation_id", key))
    resolved = {"status_event": TaskEvent.EXTERNAL_RESOLVED, "resolve_waits": [cid],
                "cancel_timers": [_timer_id(actor.task_id, cid)],
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
            events=[("action.confirmed", {"key": key, "tool": tool.name})], **resolved)
    else:
        error = {"code": "FAILED", "message": str(body.get("error") or "provider failed")}
        await actor.commit(action=ActionWrite(key, "FAILED", error=error),
                          events=[("action.failed", {"key": key, "tool": tool.name,
                                                     "reason": "provider reported failure",
                                                     "error": error})], **resolved)
    actor.ref.tell(_advance())
    return "processed"

async def external_timeout(actor: TaskActor, env: Envelope, payload: dict[str, Any]) -> str:
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
            events=[("action.reconciled", {"key": key, "found": True,
                                           "after": "confirmation timeout"})])
        actor.ref.tell(_advance())
        return "processed"
    rearms = int(payload.get("rearms", 0))
    if ok and isinstance(value, Accepted) and rearms < MAX_PENDING_REARMS:
        timeout = float(payload.get("timeout", 60.0))
        await actor.commit(
            inbox_message_id=env.message_id,
            timers=[TimerWrite(_timer_id(actor.task_id, cid), "external_timeout",
                               actor.deps.clock.now() + timeout,
                               {**payload, "rearms": rearms + 1})],
            events=[("action.still_pending", {"key": key, "rearms": rearms + 1})])
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

def _advance() -> Any:
    from ratchet.actors.task_actor import Advance

    return Advance()



