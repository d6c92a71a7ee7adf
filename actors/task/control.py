"""Operator control of a running task: cancel, pause, resume.

The admin service records the request on the task first (``tasks.control``, with an event),
then tells the task's actor. The actor acts at a safe point: between steps — a running step
(or an agent's model call) is interrupted for a cancel at once, but a write in flight is
waited for (``action.cancelling``) until its outcome is recorded, up to the cancel timeout;
past it the call is detached (``action.detached``) and the action sweeper settles it later
(actors/task/open_actions.py, settle_task.py). A pending request found on activation (the
actor was parked, or crashed) is acted on at once.

- cancel → branches and tool sessions stop; compensations run if the workflow declares
  ``compensate_on_cancel``; actions still not settled are marked UNKNOWN for the action
  sweeper (which compensates a detached one found done, if the workflow asks); CANCELLED
  (never FAILED; a late result can never make it SUCCEEDED: terminal states absorb).
- pause → PAUSED at the next safe point (from QUEUED, RUNNING or SLEEPING); the actor
  passivates. A fan-out's branches stop first, each at its own next safe point, their
  progress committed (actors/task/branch_run.py); the resumed task starts them from there.
- retry-branch → one failed branch of the fan-out waiting for its join runs again
  (actors/task/branch_retry.py).
- resume → re-checks the workflow version, the deadline and the budget, then QUEUED and on
  from the latest checkpoint.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.effects.actions import HandoffRequired
from ratchet.actors.effects.saga import compensate_task
from ratchet.actors.task.branch_place import stop_branches
from ratchet.actors.task.branch_retry import retry_branch
from ratchet.actors.task.definition_guard import definition_change
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import pause, suspend
from ratchet.persistence.ledger import ActionWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus, is_terminal

__all__ = ["handle_control", "apply_pending_control"]

#: Where a pause applies (a sleeping task keeps its wake time: actors/task/sleep_node.py).
_PAUSABLE = (TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.SLEEPING)


async def apply_pending_control(actor: TaskKernel) -> bool:
    """Act on a request recorded while no actor was listening; True if the task stopped."""
    assert actor.record is not None
    control = actor.record.control
    if "cancel" in control:
        await cancel(actor, control["cancel"])
        return True
    if "pause" in control and actor.status in _PAUSABLE:
        await pause(actor, control["pause"])
        return True
    return False


async def handle_control(actor: TaskKernel, env: Envelope) -> str:
    action = env.body.get("action")
    request = dict(env.body.get("request") or {})
    if is_terminal(actor.status):
        return f"already {actor.status.value}"
    if action == "cancel":
        await cancel(actor, request)
        return "cancelled"
    if action == "pause":
        if actor.status not in _PAUSABLE:
            return f"not paused: {actor.status.value}"
        await pause(actor, request)
        return "paused"
    if action == "resume":
        return await resume(actor, request)
    if action == "retry-branch":
        return await retry_branch(actor, request)
    return "ignored"


async def cancel(actor: TaskKernel, request: dict[str, Any]) -> None:
    assert actor.workflow is not None
    await actor.deps.children.stop_children(actor.task_id, None)  # joins, tool sessions
    for key in list(actor.joins):  # its fan-outs' branches, on whichever node they run
        await stop_branches(actor, key)
    actor.joins.clear()
    compensated: list[str] = []
    if actor.workflow.compensate_on_cancel and actor.status is TaskStatus.RUNNING:
        runner = actor.runner(actor.next_step, None, task_deadline=False, count_tool_calls=False)
        try:
            compensated = await compensate_task(runner, actor.deps.store, actor.deps.registry,
                                                actor.task_id)
        except HandoffRequired as signal:  # an undo that failed for good: a human decides
            signal.package["cancel"] = request
            await actor.commit(control={}, events=[(EventType.TASK_CANCEL_INCOMPLETE, {
                "by": request.get("by"), "reason": signal.reason})])
            await suspend(actor, signal)
            return
    detached = actor.open_actions.detached()  # still running past the cancel timeout
    unknown = [a.key for a in await actor.deps.store.task_actions(actor.task_id)
               if a.status in ("IN_FLIGHT", "PENDING") and not a.accepted]
    for key in unknown:  # left for the action sweeper, which settles them by query
        event = (EventType.ACTION_DETACHED, {
            "key": key, "tool": detached[key], "reason": "still running after the cancel"
            " timeout"}) if key in detached else (EventType.ACTION_UNKNOWN, {
                "key": key, "reason": "task cancelled"})
        await actor.commit(action=ActionWrite(key, "UNKNOWN"), events=[event])
    await actor.commit(status_event=TaskEvent.CANCELLED, control={},
                       events=[(EventType.TASK_CANCELLED, {"by": request.get("by"),
                                                   "reason": request.get("reason"),
                                                   "unknown_actions": unknown,
                                                   "detached": sorted(detached),
                                                   "compensated": compensated})])
    actor.log.warning("task cancelled", by=request.get("by"))
    actor.passivate()



async def resume(actor: TaskKernel, request: dict[str, Any]) -> str:
    assert actor.record is not None and actor.workflow is not None
    # Refusals are answers, not raises: a raise here would crash the actor.
    if actor.status is not TaskStatus.PAUSED:
        return f"refused: resume needs a PAUSED task, not {actor.status.value}"
    if actor.record.deadline_at is not None \
            and actor.deps.clock.due_now() >= actor.record.deadline_at:
        return "refused: the task's deadline passed while it was paused"
    budget, spent = actor.record.budget, actor.spent
    over = [d for d in ("tokens", "model_calls", "tool_calls", "money")
            if budget.get(d) is not None and spent.get(d, 0) >= budget[d]]
    if over:
        return f"refused: budget exhausted: {over}"
    changed = definition_change(actor)  # actors/task/definition_guard.py
    if changed is not None and request.get("accept_definition") is not True:
        return (f"refused: workflow {actor.workflow.name} v{actor.workflow.version} is"
                f" registered with another definition ({changed[1][:19]}...) than the task"
                " started on: resume with accept_definition=true to go on under it")
    await actor.commit(status_event=TaskEvent.RESUMED, events=[(EventType.TASK_RESUMED, {
        "by": request.get("by"), "workflow": actor.workflow.name,
        "version": actor.workflow.version, "from_checkpoint": actor.record.last_checkpoint,
        "at_node": actor.current, "definition": changed[1] if changed else None})],
        definition_hash=changed[1] if changed else None)
    actor.advance()
    return "resumed"
