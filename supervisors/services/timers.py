"""Durable timers: rows in the store, fired against the injected clock.

The service sleeps (on the clock) until the earliest due timer, at most ``poll`` seconds,
then delivers each due timer to its task's actor (activating it: a waiting task has no
live actor) as mail of type ``timer.fired`` and marks it fired once the actor answered.
A timer survives a restart because it is only a row; the task's inbox (the mail's
message id is derived from the timer id) keeps a repeated firing from acting twice.

Timers are judged against the clock's ``due_now()``: while a forward step of the wall
clock is held (protocol/clock_guard.py), the timers it alone made due wait.
"""

from __future__ import annotations

import structlog

from ratchet.actors.core.actor import ServiceActor
from ratchet.actors.task.actor import DeliverMail
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import TaskFinished
from ratchet.protocol.messages import Envelope
from ratchet.supervisors.supervision.tasks import TaskSupervision

__all__ = ["TimerService"]

log = structlog.get_logger("ratchet.timers")


class TimerService(ServiceActor):
    def __init__(self, store: TaskStore, tasks: TaskSupervision, clock: Clock,
                 poll: float = 1.0) -> None:
        self.store = store
        self.tasks = tasks
        self.clock = clock
        self.poll = poll
        self.fired = 0

    async def serve(self) -> None:
        while True:
            now = self.clock.due_now()
            delivered = await self.fire_due(now)
            next_due = await self.store.next_timer_due()
            wait = self.poll if next_due is None else min(self.poll,
                                                          next_due - self.clock.due_now())
            if next_due is not None and next_due <= now and not delivered:
                # Due, but not ours (another node's partition) or not deliverable yet: do
                # not spin; its owner fires it.
                wait = min(self.poll, 0.1)
            await self.clock.sleep(max(wait, 0.0))

    async def fire_due(self, now: float | None = None) -> int:
        """Deliver every timer due now; returns how many were delivered."""
        due = await self.store.due_timers(self.clock.due_now() if now is None else now)
        delivered: list[tuple[str, float]] = []
        owns = self.tasks.owns
        for timer in due:
            if owns is not None and not owns(timer["task_id"]):
                continue  # another node's partition: its owner fires it
            try:
                ref = await self.tasks.ensure_running(timer["task_id"])
            except TaskFinished:
                delivered.append((timer["timer_id"], timer["due_at"]))  # nothing left to time out
                continue
            if ref is None:
                continue  # its supervisor is between restarts: next round
            env = Envelope(type=MessageType.TIMER_FIRED,
                           message_id=f"timer:{timer['timer_id']}:{timer['due_at']}",
                           correlation_id=timer["timer_id"], sent_at=self.clock.now(),
                           body={"kind": timer["kind"], "payload": timer["payload"],
                                 "timer_id": timer["timer_id"]})
            try:
                outcome = await ref.ask(DeliverMail(env), timeout=60.0)
            except Exception as exc:  # the actor crashed or stopped: try again next round
                log.warning("timer delivery failed", timer_id=timer["timer_id"], error=repr(exc))
                continue
            log.info("timer fired", task_id=timer["task_id"], kind=timer["kind"], outcome=outcome)
            delivered.append((timer["timer_id"], timer["due_at"]))
        if delivered:
            await self.store.mark_timers_fired(delivered, self.clock.now())
            self.fired += len(delivered)
        return len(delivered)
