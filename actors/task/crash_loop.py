"""The crash-loop guard on recovery.

Each recovery of a RUNNING task (its actor restarted, or a node activating it) is a
``task.recovered`` event. When one makes more than ``max_recoveries`` within
``recovery_window`` seconds — counted since the latest ``task.recovery_stopped`` — the task
is not run again: it goes to a human (WAITING_APPROVAL, a handoff package with the evidence,
a pending approval at the pseudo-node :data:`RECOVERY_NODE`, ``task.recovery_stopped``).
Approving that approval resumes the task from its checkpoint and the count starts afresh;
rejecting it ends the task FAILED, compensating first like any failure.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.effects.actions import HandoffRequired
from ratchet.actors.effects.saga import pending_compensations
from ratchet.actors.task.decision_audit import CRASH_LOOP, decision_entry
from ratchet.actors.task.deps import error_of
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.pseudo_approvals import Decided, pending_decision
from ratchet.actors.task.suspension import fail_with_saga, handoff_package, unresolved_actions
from ratchet.persistence.graph_rows import ApprovalWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.codec import canonical
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.ids import new_id, request_hash
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent

__all__ = ["RECOVERY_NODE", "crash_loop", "on_recovery_decision", "record_recovery"]

#: The ``node`` of a crash-loop handoff's approval row: no graph node (their names cannot
#: start with ``@``), so the graph's approval handling never takes it for one of its own.
RECOVERY_NODE = "@recovery"

#: Recovery reasons the guard does not count.
COUNTED_OUT = frozenset({"partition_handover"})

#: How many of the latest step failures a crash-loop handoff shows.
_FAILURES_SHOWN = 5


#: What the guard reads of the task's recent history (one indexed read, on recovery only).
_HISTORY = (EventType.TASK_RECOVERED, EventType.TASK_RECOVERY_STOPPED, EventType.STEP_FAILED)


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
    stopped = max((i for i, e in enumerate(history) if e["type"] == EventType.TASK_RECOVERY_STOPPED),
                  default=-1)
    fresh = history[stopped + 1:]
    # A clean hand-over (drain, rebalance, a node's clean stop) says nothing about the task:
    # only restarts and recoveries after a crash of the actor or the node count.
    recoveries = [e for e in fresh if e["type"] == EventType.TASK_RECOVERED
                  and (e.get("payload") or {}).get("reason") not in COUNTED_OUT]
    if len(recoveries) <= max_recoveries:
        return None
    return recoveries, [e for e in fresh if e["type"] == EventType.STEP_FAILED]


async def record_recovery(actor: TaskKernel, reason: str) -> bool:
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
    this = {"type": EventType.TASK_RECOVERED, "sequence": None, "occurred_at": now, "payload": payload}
    loop = crash_loop([*history, this], deps.max_recoveries)
    if loop is None:
        await actor.commit(events=[(EventType.TASK_RECOVERED, payload)])
        actor.log.info("task recovered", reason=payload["reason"], node=actor.current)
        return True
    await _stop_crash_loop(actor, payload, *loop)
    return False


async def _recovery_note(actor: TaskKernel) -> dict[str, Any]:
    try:
        extra = actor.deps.hooks.recovery_note(actor.task_id)
    except Exception as exc:  # a note is evidence, never a reason not to recover
        actor.log.warning("recovery note failed", error=repr(exc))
        return {}
    return dict(extra) if isinstance(extra, dict) else {}


async def _stop_crash_loop(actor: TaskKernel, recovered: dict[str, Any],
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
        events=[(EventType.TASK_RECOVERED, recovered),
                (EventType.TASK_RECOVERY_STOPPED, {
                    "reason": reason, "recoveries": len(recoveries), "window_s": window,
                    "max_recoveries": deps.max_recoveries, "node": deps.producer,
                    "approval_id": approval_id, "request_hash": digest}),
                (EventType.TASK_HANDOFF, {"reason": reason, "why": reason, "approval_id": approval_id})])
    actor.log.error("task handed to a human: crash loop", recoveries=len(recoveries),
                    window_s=window, approval_id=approval_id)
    actor.passivate()


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


async def on_recovery_decision(actor: TaskKernel, env: Envelope) -> str | None:
    """A human's decision on a crash-loop handoff: approve resumes the task from its
    checkpoint, reject ends it FAILED (after compensating). None when the approval is not a
    crash-loop one: the graph's approval nodes handle it."""
    decided = await pending_decision(actor, env, RECOVERY_NODE)
    if not isinstance(decided, Decided):
        return decided  # not a crash-loop approval (None), or a refusal
    decision, decided_by, settle = decided.decision, decided.decided_by, decided.settle
    event = (EventType.APPROVAL_DECIDED, decided.payload("crash_loop", actor.current))
    audit = decision_entry(actor, env, "applied", CRASH_LOOP)  # a handoff resolved
    back_to_running: dict[str, Any] = {
        "status_event": TaskEvent.APPROVAL_DECIDED, "approval": settle,
        "inbox_message_id": env.message_id, "events": [event], "audit": audit}
    if decision == "approve":
        await actor.commit(**back_to_running)
        actor.log.warning("crash loop: resumed by a human", decided_by=decided_by)
        actor.advance()
        return "processed"
    reason = "crash loop: a human rejected resuming the task"
    cause = RatchetError(reason, decided_by=decided_by)
    actions = await actor.deps.store.task_actions(actor.task_id)
    if unresolved_actions(actions) or await pending_compensations(
            actor.deps.store, actor.deps.registry, actor.task_id, actions):
        # Undoing needs a RUNNING task (an undo that fails goes to a human again).
        await actor.commit(**back_to_running)
        await fail_with_saga(actor, cause, reason)
        return "processed"
    # Nothing to undo: FAILED in the decision's own transaction, so no restart in between
    # can take the task for running.
    error = error_of(cause, reason)
    await actor.commit(status_event=TaskEvent.FAILED, error=error, approval=settle,
                       inbox_message_id=env.message_id, audit=audit,
                       events=[event, (EventType.TASK_FAILED, {"reason": reason, "error": error,
                                                         "compensated": []})])
    actor.log.warning("crash loop: task ended by a human", decided_by=decided_by)
    actor.passivate()
    return "processed"
