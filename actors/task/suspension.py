"""How a task stops where it stands: suspension (waiting for a confirmation, for a human,
or paused by an operator) and failure with compensation (the saga).

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`); each runs in the task
actor's own asyncio task and ends by passivating the actor: a parked task costs a store
row, not a live actor.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.effects.actions import (
    AwaitExternal,
    HandoffRequired,
    PauseRequested,
    TaskSuspended,
)
from ratchet.actors.effects.saga import compensate_task
from ratchet.actors.effects.settle import registered_tool, settle_action
from ratchet.actors.task.branch_place import hold_branches
from ratchet.actors.task.deps import error_of
from ratchet.actors.task.handoff_package import Where, build_package
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.step_sleep import SleepRequested, start_sleeping
from ratchet.persistence.ledger import ActionRecord, TimerWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import ActionFailed
from ratchet.protocol.states import TaskEvent

__all__ = ["suspend", "pause", "handoff_package", "fail_with_saga", "unresolved_actions",
           "external_timer_id", "is_open_wait"]

def external_timer_id(task_id: str, correlation_id: str) -> str:
    return f"ext:{task_id}:{correlation_id}"


async def is_open_wait(actor: TaskKernel, correlation_id: str, kind: str) -> bool:
    """Whether ``correlation_id`` names an open wait of this task of ``kind``
    (``node:<name>`` or ``action:<key>``); a resolution that names another is logged and
    must be ignored.

    The store's row decides, not the mail: the external router looked it up too, but
    mail may come from elsewhere (docs/security.md), and a resolution must never complete
    a wait it does not name."""
    assert actor.record is not None
    found = await actor.deps.store.find_wait(actor.record.tenant, correlation_id)
    if found == (actor.task_id, kind):
        return True
    actor.log.warning("resolution for no open wait of this task ignored",
                      correlation_id=correlation_id[:200], kind=kind,
                      open_wait=found is not None)
    return False


async def suspend(actor: TaskKernel, signal: TaskSuspended) -> None:
    """Record why the task cannot go on, then passivate (stop this actor)."""
    if isinstance(signal, PauseRequested):
        await pause(actor, before_tool=signal.tool)
        return
    if isinstance(signal, SleepRequested):
        await start_sleeping(actor, signal)
    if isinstance(signal, AwaitExternal):
        due = actor.deps.clock.now() + signal.timeout
        await actor.commit(
            status_event=TaskEvent.WAITING_EXTERNAL,
            waits=[(signal.correlation_id, f"action:{signal.key}")],
            timers=[TimerWrite(external_timer_id(actor.task_id, signal.correlation_id),
                               "external_timeout", due,
                               {"key": signal.key, "correlation_id": signal.correlation_id,
                                "rearms": 0, "timeout": signal.timeout})],
            events=[(EventType.TASK_WAITING_EXTERNAL, {"key": signal.key,
                                               "correlation_id": signal.correlation_id,
                                               "timeout_s": signal.timeout})])
        actor.log.info("task waiting for a confirmation", correlation_id=signal.correlation_id)
    elif isinstance(signal, HandoffRequired):
        package = await handoff_package(actor, signal)
        event = TaskEvent.WAITING_APPROVAL if signal.approval else TaskEvent.OUTCOME_UNKNOWN
        change = dict(signal.change)  # a gated call's approval (actors/effects/risk.py)
        first = change.pop("events", [])
        await actor.commit(
            status_event=event, handoff=(signal.reason, package), **change,
            events=[*first, (EventType.TASK_HANDOFF if signal.approval
                             else EventType.TASK_UNKNOWN, {"reason": signal.reason, "why": package.get("why"),
                      "key": package.get("key")})])
        actor.log.warning("task handed to a human", reason=signal.reason, status=actor.status)
    actor.passivate()


async def handoff_package(actor: TaskKernel, signal: HandoffRequired) -> dict[str, Any]:
    """Everything a human needs (actors/task/handoff_package.py): the task, where it stands,
    its ledger, budgets, errors, who was asked, and a recommended next action."""
    assert actor.record is not None
    where = Where(actor.current, actor.next_step, sorted(actor.state), dict(actor.spent),
                  actor.deps.clock.now())
    return await build_package(actor.deps.store, actor.deps.registry, actor.record, where,
                               signal.reason, signal.package)


async def fail_with_saga(actor: TaskKernel, cause: BaseException, reason: str) -> None:
    """Compensate completed side effects in reverse order, then end FAILED.

    A write whose outcome is not known (IN_FLIGHT or UNKNOWN: the step gave up while it was
    in flight) must not be forgotten by a FAILED: the task goes UNKNOWN with a handoff
    naming it instead — a human decides, nothing is compensated or resent blindly."""
    actions = await actor.deps.store.task_actions(actor.task_id)
    unresolved = unresolved_actions(actions)
    if unresolved:  # ask the provider first (actors/effects/settle.py); a human if in doubt
        runner = actor.runner(actor.next_step, None, task_deadline=False, count_tool_calls=False)
        for row in unresolved:
            await settle_action(runner, registered_tool(actor.deps.registry, row.tool), row,
                                "failure", ended=True)
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
                      events=[(EventType.TASK_FAILED, {"reason": reason, "error": error,
                                               "compensated": compensated})])
    actor.log.warning("task failed", reason=reason, compensated=compensated)
    actor.passivate()


def unresolved_actions(actions: list[ActionRecord]) -> list[ActionRecord]:
    """Writes whose outcome is not known. Compensations in flight are not in doubt: the saga
    reconciles them."""
    return [a for a in actions if a.status in ("IN_FLIGHT", "UNKNOWN") and not a.accepted
            and a.compensates is None]


async def pause(actor: TaskKernel, request: dict[str, Any] | None = None,
                before_tool: str | None = None) -> None:
    """Pause now; ``request`` defaults to the one recorded on the task."""
    if request is None:
        request = dict(actor.record.control.get("pause") or {}) if actor.record else {}
    await hold_branches(actor, "pause")  # a fan-out's: each at its own next safe point
    actor.pause_requested = False
    await actor.commit(status_event=TaskEvent.PAUSED, control={},
                       events=[(EventType.TASK_PAUSED, {"by": request.get("by"),
                                                "reason": request.get("reason"),
                                                "at_node": actor.current,
                                                "before_tool": before_tool})])
    actor.passivate()  # passivate until resumed
