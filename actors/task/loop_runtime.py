"""How a task actor runs a loop node: its body once per iteration, one commit each.

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`), run in the task actor's
own asyncio task. An iteration runs as a step (``run_step``: the same timeout, retries,
interrupts and suspensions), then :func:`leave_iteration` evaluates ``until`` on the new
state and makes the one commit of the iteration: its state changes, its
``step.completed`` event (with ``iteration``), where the task goes next, and the count
``visits[loop]`` of the iterations committed since the task entered the loop (cleared when
it leaves, so a loop entered again starts from 0). There is no separate loop-state
commit: the count rides in the task row the iteration's checkpoint updates anyway.

After a crash the task is still at the loop with the count of the last committed
iteration, so it runs the next one: a committed iteration never runs again, the one in
flight runs again (steps are at-least-once).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import fail_with_saga
from ratchet.actors.workflow.loop_node import LoopNode
from ratchet.actors.workflow.nodes import FAIL, StepNode
from ratchet.persistence import StateDelta
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import RatchetError

__all__ = ["iteration_of", "leave_iteration", "run_loop"]


def iteration_of(actor: TaskKernel, step: StepNode) -> int | None:
    """The iteration a loop's body runs now (from 0); None for a plain step."""
    return actor.visits.get(step.name, 0) if isinstance(step, LoopNode) else None


async def run_loop(actor: TaskKernel, node: LoopNode) -> bool:
    """Run the loop's next iteration; True when it committed and the task can go on."""
    if actor.visits.get(node.name, 0) >= node.max_iterations:
        # Only an ``until`` that never held gets here (with on_exhausted="fail"): the last
        # iteration was committed like the others, and the task fails now.
        await fail_with_saga(actor, RatchetError(
            f"loop {node.name} ran {node.max_iterations} iterations and until never held",
            node=node.name), "loop bound exceeded")
        return False
    return await actor.run_step(node)


async def leave_iteration(actor: TaskKernel, step: StepNode, index: int, started: float,
                          delta: StateDelta) -> bool:
    """Commit the iteration that just ran (``delta``: the state it changed) and go on:
    the loop again, ``next`` or ``on_exhausted``. False when ``until`` raised (the task
    failed, as for a guard that raises)."""
    assert isinstance(step, LoopNode)
    done_before = actor.visits.get(step.name, 0)
    last = done_before + 1 >= step.max_iterations
    try:
        finished = bool(step.until(actor.state)) if step.until is not None else last
    except Exception as exc:
        await fail_with_saga(actor, exc, f"until of {step.name} raised")
        return False
    to = step.name
    if finished:
        to = step.next
    elif last and step.on_exhausted != FAIL:
        to = step.on_exhausted
    visits = {k: v for k, v in actor.visits.items() if k != step.name}
    if to == step.name:
        visits[step.name] = done_before + 1
    duration = asyncio.get_running_loop().time() - started
    payload: dict[str, Any] = {"step": step.name, "index": index, "iteration": done_before,
                               "duration_ms": round(duration * 1000, 3), "changed": None,
                               "next": to}
    await actor.move(step.name, to, [(EventType.STEP_COMPLETED, payload)], delta=delta,
                     visits=visits)
    return True
