"""How a task actor runs a sleep node (actors/workflow/sleep.py): park the task SLEEPING on
a durable timer, and go on to the node's ``next`` when the timer fires.

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`), run in the task actor's
own asyncio task. While it sleeps the task is a ``tasks`` row and a ``timers`` row: no
actor, no memory; the timer service (supervisors/services/timers.py) of whichever node
holds the task's partition fires it, after any number of restarts.

The wake time is absolute and kept in the timer's payload, so that nothing moves it:

- the timer is due at the wake time, or at the task's deadline if that comes first; a
  timer fired before the wake time makes the task RUNNING again for the deadline check
  at its next step boundary (``task deadline passed``: the saga, then FAILED);
- a pause while sleeping (SLEEPING → PAUSED) leaves the wake time as it was: resumed
  before it, the task sleeps the rest; after it, it goes on at once;
- a cancel while sleeping ends the task like any cancel (its timer then finds it finished).
"""

from __future__ import annotations

import math

from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import fail_with_saga
from ratchet.actors.workflow.sleep import SleepNode
from ratchet.persistence.ledger import TimerWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus

__all__ = ["SLEEP_TIMER", "enter_sleep", "on_sleep_timer", "sleep_timer_id"]

#: The timer kind of a sleep node.
SLEEP_TIMER = "sleep"


def sleep_timer_id(task_id: str, node: str, visit: int) -> str:
    """One timer per visit of the node: a sleep inside a loop sleeps again each time."""
    return f"sleep:{task_id}:{node}:{visit}"


def _timer_id(actor: TaskKernel, node: str) -> str:
    return sleep_timer_id(actor.task_id, node, actor.visits.get(node, 0))


def _wake_time(actor: TaskKernel, node: SleepNode) -> float:
    if node.seconds is not None:
        return actor.deps.clock.now() + node.seconds
    assert node.until is not None
    value = node.until(actor.state)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"until must return seconds since the epoch, got {value!r}")
    return float(value)


async def enter_sleep(actor: TaskKernel, node: SleepNode) -> bool:
    """Park the task until the node's wake time; True when that time has come already
    (the task moved on and can continue now)."""
    assert actor.record is not None
    timer_id = _timer_id(actor, node.name)
    armed = await actor.deps.store.timer_payload(timer_id)
    if armed is not None and "wake_at" in armed:
        wake_at = float(armed["wake_at"])  # entered before (a pause, an early timer): keep it
    else:
        try:
            wake_at = _wake_time(actor, node)
        except Exception as exc:
            await fail_with_saga(actor, exc, f"until of {node.name} raised")
            return False
    now = actor.deps.clock.due_now()
    if wake_at <= now:
        await _move_on(actor, node, wake_at, slept=False)
        return True
    deadline = actor.record.deadline_at
    due = wake_at if deadline is None else min(wake_at, deadline)
    await actor.commit(
        status_event=TaskEvent.SLEPT,
        timers=[TimerWrite(timer_id, SLEEP_TIMER, due, {"node": node.name, "wake_at": wake_at})],
        events=[(EventType.SLEEP_STARTED, {"node": node.name, "wake_at": wake_at, "due_at": due,
                                           "seconds": round(wake_at - now, 3)})])
    actor.log.info("task sleeping", node=node.name, wake_at=wake_at)
    actor.passivate()  # a sleeping task costs two rows, not a live actor
    return False


async def _move_on(actor: TaskKernel, node: SleepNode, wake_at: float, *, slept: bool,
                   inbox_message_id: str | None = None) -> None:
    await actor.move(node.name, node.next, [(EventType.SLEEP_COMPLETED, {
        "node": node.name, "wake_at": wake_at, "to": node.next})],
        status_event=TaskEvent.WOKE if slept else None, inbox_message_id=inbox_message_id)


async def on_sleep_timer(actor: TaskKernel, env: Envelope) -> str | None:
    """A sleep node's timer fired; None when the timer is not a sleep's."""
    if env.body.get("kind") != SLEEP_TIMER:
        return None
    assert actor.workflow is not None
    node = actor.workflow.nodes.get(actor.current)
    timer_id = _timer_id(actor, node.name) if isinstance(node, SleepNode) else None
    if actor.status is not TaskStatus.SLEEPING or timer_id is None \
            or env.body.get("timer_id") != timer_id:
        return "late"  # paused, cancelled, or an earlier visit's timer: nothing to wake
    assert isinstance(node, SleepNode)
    # The wake time as the store has it, not as the mail says (mail may come from elsewhere).
    armed = await actor.deps.store.timer_payload(timer_id) or {}
    wake_at = float(armed.get("wake_at", float("inf")))
    if actor.deps.clock.due_now() >= wake_at:
        await _move_on(actor, node, wake_at, slept=True, inbox_message_id=env.message_id)
    else:
        # Due before the wake time: the task's deadline came first. RUNNING again, the next
        # boundary fails it past its deadline (or, were it not passed, sleeps the rest).
        await actor.commit(status_event=TaskEvent.WOKE, inbox_message_id=env.message_id)
    actor.advance()
    return "processed"
