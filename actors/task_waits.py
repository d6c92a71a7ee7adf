"""How a task actor stops and resumes around the outside world: suspension (waiting for a
confirmation, or for a human), the mail that ends a wait, failure with compensation, and the
crash-loop guard on recovery.

Crash-loop guard: each recovery of a RUNNING task (its actor restarted, or a node activating
it) is a ``task.recovered`` event. When one makes more than ``max_recoveries`` within
``recovery_window`` seconds — counted since the latest ``task.recovery_stopped`` — the task
is not run again: it goes to a human (WAITING_APPROVAL, a handoff package with the evidence,
a pending approval at the pseudo-node :data:`RECOVERY_NODE`, ``task.recovery_stopped``).
Approving that approval resumes the task from its checkpoint and the count starts afresh;
rejecting it ends the task FAILED, compensating first like any failure.

Functions over a :class:`actors.task_actor.TaskActor`, kept apart so that each module holds
one concept; every one runs in the task actor's own asyncio task.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from actors.actions import (
    ActionFailed,
    ActionRunner,
    AwaitExternal,
    HandoffRequired,
    PauseRequested,
    TaskSuspended,
)
from actors.saga import compensate_task, pending_compensations
from actors.tools import Accepted
from persistence.graph_rows import ApprovalWrite
from persistence.ledger import ActionRecord, ActionWrite, TimerWrite
from protocol.codec import canonical
from protocol.errors import RatchetError
from protocol.ids import new_id, request_hash
from protocol.messages import Envelope
from protocol.states import TaskEvent, TaskStatus

if TYPE_CHECKING:
    from actors.task_actor import TaskActor

__all__ = ["suspend", "handoff_package", "fail_with_saga", "handle_wait_mail",
           "MAX_PENDING_REARMS", "RECOVERY_NODE", "crash_loop", "record_recovery",
           "on_recovery_decision"]

#: How many times a still-pending accepted action re-arms its timer before a human decides.
MAX_PENDING_REARMS = 3

#: The ``node`` of a crash-loop handoff's approval row: no graph node (their names cannot
#: start with ``@``), so the graph's approval handling never takes it for one of its own.
RECOVERY_NODE = "@recovery"

#: How many of the latest step failures a crash-loop handoff shows.
_FAILURES_SHOWN = 5


def _timer_id(task_id: str, correlation_id: str) -> str:
    return f"ext:{task_id}:{correlation_id}"


async def suspend(actor: TaskActor, signal: TaskSuspended) -> None:
    """Record why the task cannot go on, then passivate (stop this actor)."""
    if isinstance(signal, PauseRequested):
        from actors.task_control import pause

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
    from actors.task_actor import error_of

    actions = await actor.deps.store.task_actions(actor.task_id)
    unresolved = _unresolved(actions)
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

def _unresolved(actions: list[ActionRecord]) -> list[ActionRecord]:
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

# -- the crash-loop guard ------------------------------------------------------------------

#: What the guard reads of the task's recent history (one indexed read, on recovery only).
_HISTORY = ("task.recovered", "task.recovery_stopped", "step.failed")


def crash_loop(history: list[dict[str, Any]], max_recoveries: int
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """Whether the recoveries in ``history`` make a crash loop (a pure function).

    Args:
        history: the task's ``task.recovered``, ``task.recovery_stopped`` and ``step.failed``
            events within the window, in order, ending with the recovery being decided on.
        max_recoveries: how many recoveries within the window still go on by themselves.

    Returns:
        None to go on; else the ``(recoveries, step failures)`` since the latest
        ``task.recovery_stopped``, the evidence for a human (whose decision follows that
        event, so the count starts afresh after it).
    """
    stopped = max((i for i, e in enumerate(history) if e["type"] == "task.recovery_stopped"),
                  default=-1)
    fresh = history[stopped + 1:]
    recoveries = [e for e in fresh if e["type"] == "task.recovered"]
    if len(recoveries) <= max_recoveries:
        return None
    return recoveries, [e for e in fresh if e["type"] == "step.failed"]


async def record_recovery(actor: TaskActor, reason: str) -> bool:
    """Record that the task was recovered (``reason``: ``actor_restart`` or
    ``node_recovery``); False when that makes a crash loop, the task went to a human and
    this actor stops."""
    assert actor.record is not None
    deps = actor.deps
    now = deps.clock.now()
    payload: dict[str, Any] = {
        "reason": reason, "node": deps.producer,
        "from_checkpoint": actor.record.last_checkpoint,
        "next_step": actor.next_step, "next_node": actor.current,
        "steps_skipped": await deps.store.checkpoint_names(actor.task_id),
        "restarts": actor.restarts,
    }
    if reason == "node_recovery":  # only the node knows whom it took the task over from
        payload.update(await _recovery_note(actor))
    history = await deps.store.recent_events(actor.task_id, _HISTORY, now - deps.recovery_window)
    this = {"type": "task.recovered", "sequence": None, "occurred_at": now, "payload": payload}
    loop = crash_loop([*history, this], deps.max_recoveries)
    if loop is None:
        await actor.commit(events=[("task.recovered", payload)])
        actor.log.info("task recovered", reason=payload["reason"], node=actor.current)
        return True
    await _stop_crash_loop(actor, payload, *loop)
    return False


async def _recovery_note(actor: TaskActor) -> dict[str, Any]:
    note = actor.deps.recovery_note
    if note is None:
        return {}
    try:
        extra = note(actor.task_id)
        if inspect.isawaitable(extra):
            extra = await extra
    except Exception as exc:  # a note is evidence, never a reason not to recover
        actor.log.warning("recovery note failed", error=repr(exc))
        return {}
    return dict(extra) if isinstance(extra, dict) else {}


async def _stop_crash_loop(actor: TaskActor, recovered: dict[str, Any],
                           recoveries: list[dict[str, Any]],
                           failures: list[dict[str, Any]]) -> None:
    """Hand the task to a human: one transaction with this recovery, the reason it stops,
    the handoff package and its pending approval; then passivate."""
    deps = actor.deps
    window = deps.recovery_window
    reason = f"crash loop: {len(recoveries)} recoveries in {window:g} s"
    approval_id = new_id("apr")
    request = {"kind": "crash_loop", "recoveries": len(recoveries), "window_s": window,
               "next_node": actor.current, "next_step": actor.next_step}
    digest = request_hash(canonical(request))
    evidence = {
        "why": reason, "kind": "crash_loop", "approval_id": approval_id,
        "request_hash": digest, "max_recoveries": deps.max_recoveries,
        "recoveries": [_recovery_evidence(e) for e in recoveries],
        "step_failures": [_failure_evidence(e) for e in failures[-_FAILURES_SHOWN:]],
        "options": ["approve: resume from the last checkpoint (the count starts afresh)",
                    "reject: end the task FAILED (completed side effects are compensated)"]}
    package = await handoff_package(actor, HandoffRequired(reason, evidence, approval=True))
    await actor.commit(
        status_event=TaskEvent.WAITING_APPROVAL, handoff=(reason, package),
        approval=ApprovalWrite(approval_id, "PENDING", insert=True, node=RECOVERY_NODE,
                               request=request, request_hash=digest),
        events=[("task.recovered", recovered),
                ("task.recovery_stopped", {
                    "reason": reason, "recoveries": len(recoveries), "window_s": window,
                    "max_recoveries": deps.max_recoveries, "node": deps.producer,
                    "approval_id": approval_id, "request_hash": digest}),
                ("task.handoff", {"reason": reason, "why": reason, "approval_id": approval_id})])
    actor.log.error("task handed to a human: crash loop", recoveries=len(recoveries),
                    window_s=window, approval_id=approval_id)
    actor.ref.stop()


def _recovery_evidence(event: dict[str, Any]) -> dict[str, Any]:
    """One recovery for a human, without the list of steps skipped (``next_step`` and
    ``next_node`` say where it stood); the one being recorded has no sequence yet."""
    payload = {k: v for k, v in (event["payload"] or {}).items() if k != "steps_skipped"}
    where = {} if event["sequence"] is None else {"sequence": event["sequence"]}
    return {**where, "occurred_at": event["occurred_at"], **payload}


def _failure_evidence(event: dict[str, Any]) -> dict[str, Any]:
    payload = event["payload"] or {}
    return {"sequence": event["sequence"], "occurred_at": event["occurred_at"],
            **{k: payload.get(k) for k in ("step", "index", "attempt", "error")}}


async def on_recovery_decision(actor: TaskActor, env: Envelope) -> str | None:
    """A human's decision on a crash-loop handoff: approve resumes the task from its
    checkpoint, reject ends it FAILED (after compensating). None when the approval is not a
    crash-loop one: the graph's approval nodes handle it."""
    from actors.task_actor import error_of

    body = env.body
    decision = body.get("decision")
    if decision not in ("approve", "reject"):
        return None  # refused where every decision is checked
    approval_id = str(body.get("approval_id", ""))
    row = await actor.deps.store.approval(approval_id)
    if row is None or row["node"] != RECOVERY_NODE:
        return None
    if row["task_id"] != actor.task_id:
        return "unknown approval"
    if actor.status is not TaskStatus.WAITING_APPROVAL:
        return "late"
    if row["status"] != "PENDING":
        return f"already {row['status'].lower()}"  # one-time: a repeat changes nothing
    if body.get("request_hash") not in (None, row["request_hash"]):
        return "request changed"
    decided_by = str(body.get("decided_by") or "unknown")
    settle = ApprovalWrite(approval_id, "APPROVED" if decision == "approve" else "REJECTED",
                           decided_by=decided_by, reason=body.get("reason"))
    decided = ("approval.decided", {
        "kind": "crash_loop", "approval_id": approval_id, "decision": decision,
        "decided_by": decided_by, "reason": body.get("reason"), "at_node": actor.current})
    back_to_running: dict[str, Any] = {
        "status_event": TaskEvent.APPROVAL_DECIDED, "approval": settle,
        "inbox_message_id": env.message_id, "events": [decided]}
    if decision == "approve":
        await actor.commit(**back_to_running)
        actor.log.warning("crash loop: resumed by a human", decided_by=decided_by)
        actor.ref.tell(_advance())
        return "processed"
    reason = "crash loop: a human rejected resuming the task"
    cause = RatchetError(reason, decided_by=decided_by)
    actions = await actor.deps.store.task_actions(actor.task_id)
    if _unresolved(actions) or await pending_compensations(
            actor.deps.store, actor.deps.registry, actor.task_id, actions):
        # Undoing needs a RUNNING task (an undo that fails goes to a human again).
        await actor.commit(**back_to_running)
        await fail_with_saga(actor, cause, reason)
        return "processed"
    # Nothing to undo: FAILED in the decision's own transaction, so no restart in between
    # can take the task for running.
    error = error_of(cause, reason)
    await actor.commit(status_event=TaskEvent.FAILED, error=error, approval=settle,
                       inbox_message_id=env.message_id,
                       events=[decided, ("task.failed", {"reason": reason, "error": error,
                                                         "compensated": []})])
    actor.log.warning("crash loop: task ended by a human", decided_by=decided_by)
    actor.ref.stop()
    return "processed"


def _advance() -> Any:
    from actors.task_actor import Advance

    return Advance()



