"""A task never runs silently on changed code: when its workflow version is registered with
another definition than the one it started on (actors/workflow/definition.py), it pauses
at its next safe point instead, with reason ``definition_changed`` (docs/workflows.md,
"Versions").

On activation the actor compares the hash on the task's row with the registered one. A
difference the workflow does not declare compatible (``Workflow(compatible_with=[...])``)
records ``task.definition_changed`` and a pause request (``tasks.control``) in one
side-channel change: a running task pauses before its next node or tool call, a parked one
as soon as it would run again (an approval, a confirmation). ``admin resume`` then refuses
unless the operator accepts the new definition (``args.accept_definition: true``): the
task goes on under it, and its row records the new hash.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ratchet.actors.task.kernel import TaskKernel
from ratchet.persistence.txns import TaskChange
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.states import TaskStatus

__all__ = ["REASON", "check_definition", "definition_change"]

REASON = "definition_changed"


def definition_change(actor: TaskKernel) -> tuple[str, str] | None:
    """(recorded hash, registered hash) when they differ and no compatibility is declared."""
    rec, wf = actor.record, actor.workflow
    if rec is None or wf is None or rec.definition_hash is None:
        return None  # not recorded (an older task, a fork, a schedule's tick)
    now = actor.deps.registry.definition_hash(wf.name, wf.version)
    if now is None or now == rec.definition_hash or rec.definition_hash in wf.compatible_with:
        return None
    return rec.definition_hash, now


async def check_definition(actor: TaskKernel) -> None:
    """On activation: a changed definition asks for a pause (module doc), once."""
    if actor.status is TaskStatus.PAUSED:
        return  # nothing to pause: its resume decides (actors/task/control.py)
    change = definition_change(actor)
    assert actor.record is not None
    control = actor.record.control
    if change is None or control.get("pause", {}).get("reason") == REASON:
        actor.pause_requested = actor.pause_requested or change is not None
        return
    started_on, registered = change
    request: dict[str, Any] = {"by": "runtime", "reason": REASON, "started_on": started_on,
                               "registered": registered, "at": actor.deps.clock.now()}
    await actor.deps.store.apply(TaskChange(
        task_id=actor.task_id, expected_version=None, producer=actor.deps.producer,
        now=actor.deps.clock.now(), control={**control, "pause": request},
        events=[(EventType.TASK_DEFINITION_CHANGED, {
            "workflow": actor.record.workflow, "version": actor.record.workflow_version,
            "started_on": started_on, "registered": registered})]))
    actor.record = replace(actor.record, control={**control, "pause": request})
    actor.pause_requested = True
    actor.log.warning("workflow definition changed: the task pauses at its next safe point",
                      started_on=started_on, registered=registered)
