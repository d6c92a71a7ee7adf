"""Settling a task's writes before it goes on (actors/effects/settle.py does one write).

- on recovery (an actor restart, a failover, a resume, an approval: every activation of a
  task that had already started), before it runs anything: each write IN_FLIGHT or
  UNKNOWN is settled by ``query``; one that cannot be is handed to a human (the task goes
  UNKNOWN), whatever path the re-run would have taken;
- at the end of a step (or an agent's turn), a write the step started and left unsettled
  (it swallowed the error, or did not wait for the call) is settled before the step
  commits, or the task is handed to a human instead;
- before SUCCEEDED, the task's whole ledger is checked the same way;
- a task that ended (the action sweeper activates it: supervisors/services/action_sweeper.py)
  settles what it left behind — a call detached by a cancel, typically — and compensates
  what turns out to have taken effect when its end asks for it (FAILED, or CANCELLED with
  ``compensate_on_cancel``); what cannot be settled gets a handoff (once).
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.effects.actions import HandoffRequired
from ratchet.actors.effects.saga import compensate_task
from ratchet.actors.effects.settle import (
    FOUND,
    UNDECIDED,
    YOUNG,
    registered_tool,
    settle_action,
    undecided_package,
)
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import suspend, unresolved_actions
from ratchet.actors.workflow.tools import Tool
from ratchet.persistence.ledger import ActionRecord
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.states import TaskStatus

__all__ = ["after_end", "before_step_end", "before_success", "on_recovery", "settle_rows"]


async def settle_rows(actor: TaskKernel, rows: list[ActionRecord], on: str, *,
                      ended: bool = False) -> tuple[list[ActionRecord], list[str]]:
    """Settle each write of ``rows``: (those nobody could settle, the keys found done).
    On recovery a write not found that may still be on its way is not waited for: it stays
    open (``open_actions.unsettled``) for the end of the step, unless the re-run step
    calls it again first (then the ledger's own reconciliation resends it)."""
    runner = actor.runner(actor.next_step, None, task_deadline=False, count_tool_calls=False)
    left: list[ActionRecord] = []
    found: list[str] = []
    for row in rows:
        outcome = await settle_action(runner, _tool(actor, row.tool), row, on, ended=ended,
                                      wait_quiet=on != "recovery")
        if outcome == UNDECIDED:
            left.append(row)
        elif outcome == FOUND:
            found.append(row.key)
        elif outcome == YOUNG:
            actor.open_actions.unsettled[row.key] = row.tool
    return left, found


async def on_recovery(actor: TaskKernel) -> bool:
    """Settle a recovered task's writes before it runs anything; False: handed off."""
    actor.open_actions.settle_due = False
    return await _settle_ledger(actor, "recovery")


async def before_step_end(actor: TaskKernel) -> None:
    """Settle the writes this actor left unsettled. Raises HandoffRequired for those that
    cannot be (the step does not commit)."""
    open_keys = actor.open_actions.unsettled
    if not open_keys:
        return
    rows = [r for r in unresolved_actions(await actor.deps.store.task_actions(actor.task_id))
            if r.key in open_keys]
    left, _ = await settle_rows(actor, rows, "step_end")
    for row in rows:
        if row not in left:
            open_keys.pop(row.key, None)
    if left:
        raise _handoff(actor, left, "step_end")


async def before_success(actor: TaskKernel) -> bool:
    """The whole ledger settled before SUCCEEDED; False: handed off instead."""
    return await _settle_ledger(actor, "task_end")


async def _settle_ledger(actor: TaskKernel, on: str) -> bool:
    """Settle every unsettled write of the task; False: one could not be, handed off."""
    rows = unresolved_actions(await actor.deps.store.task_actions(actor.task_id))
    if not rows:
        return True
    left, _ = await settle_rows(actor, rows, on)
    if left:
        await suspend(actor, _handoff(actor, left, on))
        return False
    return True


async def after_end(actor: TaskKernel) -> None:
    """Settle what a task that ended left unsettled; compensate what its end undoes."""
    assert actor.record is not None
    rows = unresolved_actions(await actor.deps.store.task_actions(actor.task_id))
    if not rows:
        return
    try:
        actor.workflow = actor.deps.registry.get(actor.record.workflow,
                                                 actor.record.workflow_version)
    except RatchetError:
        actor.log.warning("unsettled writes of a workflow not registered here",
                          keys=[r.key for r in rows])
        return
    left, found = await settle_rows(actor, rows, "sweeper", ended=True)
    undo = actor.status is TaskStatus.FAILED or (
        actor.status is TaskStatus.CANCELLED and actor.workflow.compensate_on_cancel)
    if found and undo:
        runner = actor.runner(actor.next_step, None, task_deadline=False,
                              count_tool_calls=False)
        try:
            await compensate_task(runner, actor.deps.store, actor.deps.registry, actor.task_id)
        except HandoffRequired as signal:
            await _record_handoff(actor, signal.reason, signal.package)
    if left:
        undecided = _handoff(actor, left, "sweeper")
        await _record_handoff(actor, undecided.reason, undecided.package)


async def _record_handoff(actor: TaskKernel, reason: str, package: dict[str, Any]) -> None:
    """A handoff for a task that ended (its status stays): once per action."""
    open_ = await actor.deps.store.handoffs(actor.task_id)
    if any(h.get("package", {}).get("key") == package.get("key") for h in open_):
        return
    await actor.commit(handoff=(reason, package), events=[(EventType.TASK_HANDOFF, {
        "reason": reason, "why": package.get("why"), "key": package.get("key"),
        "after_end": actor.status.value})])
    actor.log.warning("a write of an ended task handed to a human", key=package.get("key"))


def _handoff(actor: TaskKernel, left: list[ActionRecord], on: str) -> HandoffRequired:
    first = left[0]
    package = {**undecided_package(_tool(actor, first.tool), first, on),
               "unsettled": [{"key": a.key, "tool": a.tool, "status": a.status} for a in left]}
    return HandoffRequired("a write's outcome could not be settled", package)


def _tool(actor: TaskKernel, name: str) -> Tool[Any, Any] | None:
    return registered_tool(actor.deps.registry, name)
