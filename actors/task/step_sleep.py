"""``await ctx.sleep(seconds)`` inside a step: a durable timer, the task passivated.

A step that sleeps commits SLEEPING with a timer row and its actor stops: the task costs
two rows, not a live actor, for minutes or months, across restarts and failover. When the
timer fires the step **runs again from its top**, as after a crash or a pause inside a step
(actors/task/control.py): every ``ctx.call`` it had completed is answered by the ledger
(never made again), and every ``ctx.sleep`` it had completed returns at once — the n-th
sleep of the step is known by its timer (``sleep:<task>:@<step index>:<n>``), so the run
goes on after the last one. Code between calls that is not a ``ctx.call`` runs again, as
it does after any re-run; keep it free of side effects (or use a sleep node between two
steps, ``wf.sleep``, which re-runs nothing).

The wake time is absolute and kept in the timer row: a pause while sleeping, a deadline
that fires the timer early, or a re-run before the wake time all sleep only the rest.
"""

from __future__ import annotations

import math

from ratchet.actors.effects.signals import TaskSuspended
from ratchet.actors.task.kernel import TaskKernel
from ratchet.persistence.ledger import TimerWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus

__all__ = ["STEP_SLEEP_TIMER", "SleepRequested", "StepSleeper", "on_step_sleep_timer",
           "start_sleeping"]

#: The timer kind of a sleep inside a step.
STEP_SLEEP_TIMER = "step_sleep"


class SleepRequested(TaskSuspended):
    """Control signal: the step sleeps until ``wake_at`` (its timer is ``timer_id``)."""

    def __init__(self, timer_id: str, step: str, index: int, n: int, wake_at: float) -> None:
        super().__init__(timer_id)
        self.timer_id, self.step, self.index, self.n = timer_id, step, index, n
        self.wake_at = wake_at


class StepSleeper:
    """One run of one step's ``ctx.sleep``: counts the sleeps of the run, in order."""

    def __init__(self, actor: TaskKernel, step: str, index: int) -> None:
        self.actor, self.step, self.index = actor, step, index
        self.count = 0

    async def sleep(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not math.isfinite(seconds) or seconds < 0:
            raise InvalidMessage(f"ctx.sleep needs a number of seconds >= 0, got {seconds!r}")
        n, self.count = self.count, self.count + 1
        timer_id = f"sleep:{self.actor.task_id}:@{self.index}:{n}"
        armed = await self.actor.deps.store.timer_payload(timer_id)
        now = self.actor.deps.clock.due_now()
        wake_at = float(armed["wake_at"]) if armed and "wake_at" in armed else now + seconds
        if wake_at <= now:
            return  # slept already (this is a re-run), or a sleep of nothing
        raise SleepRequested(timer_id, self.step, self.index, n, wake_at)


async def start_sleeping(actor: TaskKernel, signal: SleepRequested) -> None:
    """Commit SLEEPING with the timer (due at the wake time, or the deadline if sooner)."""
    assert actor.record is not None
    deadline = actor.record.deadline_at
    due = signal.wake_at if deadline is None else min(signal.wake_at, deadline)
    await actor.commit(
        status_event=TaskEvent.SLEPT,
        timers=[TimerWrite(signal.timer_id, STEP_SLEEP_TIMER, due,
                           {"step_index": signal.index, "wake_at": signal.wake_at})],
        events=[(EventType.SLEEP_STARTED, {
            "step": signal.step, "n": signal.n, "wake_at": signal.wake_at, "due_at": due,
            "seconds": round(signal.wake_at - actor.deps.clock.due_now(), 3)})])
    actor.log.info("task sleeping in a step", step=signal.step, n=signal.n,
                   wake_at=signal.wake_at)


async def on_step_sleep_timer(actor: TaskKernel, env: Envelope) -> str | None:
    """A step's sleep timer fired: RUNNING again, the step runs again from its top (its
    completed calls and sleeps answered). None when the timer is not a step's sleep."""
    if env.body.get("kind") != STEP_SLEEP_TIMER:
        return None
    timer_id = str(env.body.get("timer_id"))
    armed = await actor.deps.store.timer_payload(timer_id) or {}
    if actor.status is not TaskStatus.SLEEPING or armed.get("step_index") != actor.next_step \
            or not timer_id.startswith(f"sleep:{actor.task_id}:@"):
        return "late"  # paused, cancelled, moved on: nothing to wake
    await actor.commit(status_event=TaskEvent.WOKE, inbox_message_id=env.message_id,
                       events=[(EventType.SLEEP_COMPLETED, {"step_index": armed["step_index"],
                                                            "wake_at": armed.get("wake_at")})])
    actor.advance()
    return "processed"
