"""The writes a task actor has under way, and the one piece of work a cancel may cut short.

The actor's commits tell it everything (actors/task/step_runner.py passes each ledger write
here): a write is *in flight* from its IN_FLIGHT commit to the next commit of its key, and
*unsettled* while its outcome is not known (IN_FLIGHT not accepted, or UNKNOWN). Two rules
follow (docs/side-effects.md, "Settling"):

- a cancel never abandons a write in flight: the work in progress is cut at once when no
  write is in flight (a model call, a read, pure computation), else as soon as the last
  write in flight has its outcome committed, and at the latest after the cancel timeout —
  then the write is *detached* (``action.detached``) and the action sweeper settles it;
- a step, a turn or the task cannot complete while one of its writes is unsettled
  (actors/task/settle_task.py settles it first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import structlog

from ratchet.persistence.ledger import ActionWrite
from ratchet.persistence.ports import TaskStore
from ratchet.persistence.txns import TaskChange
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock

__all__ = ["OpenActions", "mark_cancelling"]

log = structlog.get_logger("ratchet.task")

#: Records ``action.cancelling`` for the keys (a side-channel change: the actor is busy).
MarkCancelling = Callable[[dict[str, str]], Awaitable[None]]


class OpenActions:
    def __init__(self) -> None:
        self.in_flight: dict[str, str] = {}  # key → tool
        self.unsettled: dict[str, str] = {}  # key → tool
        self.settle_due = False  # settle the task's writes before it runs anything
        self.interrupted = False
        self._scope: asyncio.Timeout | None = None
        self._marking: set[asyncio.Task[None]] = set()
        #: Reads answered and not yet committed: their ``action.read`` events ride in the
        #: task's next commit (actors/task/read_record.py), not in a commit of their own.
        self.reads: list[tuple[str, dict[str, Any]]] = []

    def with_reads(self, change: dict[str, Any]) -> dict[str, Any]:
        """``change`` (``TaskChange`` fields) with the pending reads' events first."""
        if not self.reads:
            return change
        reads = list(self.reads)
        self.reads.clear()  # the same list: step runners made earlier hold on to it
        return {**change, "events": [*reads, *change.get("events", ())]}

    def note(self, write: ActionWrite | None) -> None:
        """What one committed ledger write says of its action."""
        if write is None:
            return
        key, tool = write.key, write.tool or self.unsettled.get(write.key, "")
        if write.status == "IN_FLIGHT" and not write.accepted:
            self.in_flight[key] = self.unsettled[key] = tool
        elif write.status == "UNKNOWN":
            self.in_flight.pop(key, None)
            self.unsettled[key] = tool
        else:  # an outcome, an accepted write (its task waits for it), a scheduled retry
            self.in_flight.pop(key, None)
            self.unsettled.pop(key, None)
        if self.interrupted and not self.in_flight and self._scope is not None:
            self._scope.reschedule(asyncio.get_running_loop().time())  # its outcome is in

    def interruptible(self, timeout: float | None) -> _Interruptible:
        """The work a cancel may cut short; one cancel scope serves its own timeout too."""
        return _Interruptible(self, asyncio.timeout(timeout))

    def take_interrupt(self) -> bool:
        """Whether the scope ended for a cancel (not its own timeout); resets the flag."""
        interrupted, self.interrupted = self.interrupted, False
        return interrupted

    def interrupt(self, grace: float, mark: MarkCancelling) -> bool:
        """Cut the work in progress short: at once, or once the writes in flight have their
        outcome, ``grace`` seconds at the latest. False when nothing is in progress."""
        scope = self._scope
        if scope is None:
            return False
        self.interrupted = True
        now = asyncio.get_running_loop().time()
        if not self.in_flight:
            scope.reschedule(now)
            return True
        scope.reschedule(now + grace)
        marking = asyncio.get_running_loop().create_task(self._mark(mark, dict(self.in_flight)))
        self._marking.add(marking)
        marking.add_done_callback(self._marking.discard)
        return True

    @staticmethod
    async def _mark(mark: MarkCancelling, calls: dict[str, str]) -> None:
        try:
            await mark(calls)
        except Exception as exc:  # the event only informs: the wait itself goes on
            log.warning("could not record action.cancelling", error=repr(exc))

    def detached(self) -> dict[str, str]:
        """The writes still in flight when the work was cut short: forgotten by the actor,
        settled later by the action sweeper."""
        calls, self.in_flight = self.in_flight, {}
        for key in calls:
            self.unsettled.pop(key, None)
        return calls

    def describe(self) -> dict[str, Any]:
        return {"in_flight": sorted(self.in_flight), "unsettled": sorted(self.unsettled)}


async def mark_cancelling(store: TaskStore, task_id: str, producer: str, clock: Clock,
                          calls: dict[str, str]) -> None:
    """``action.cancelling`` for each write in flight: a side-channel change, as the
    actor itself is busy waiting for them."""
    await store.apply(TaskChange(
        task_id=task_id, expected_version=None, producer=producer, now=clock.now(),
        events=[(EventType.ACTION_CANCELLING, {"key": key, "tool": tool})
                for key, tool in calls.items()]))


class _Interruptible:
    """:meth:`OpenActions.interruptible`'s context manager: a class, not a generator, as
    every step enters one (a generator-based one cost ~3 µs more)."""

    __slots__ = ("_owner", "_timeout")

    def __init__(self, owner: OpenActions, timeout: asyncio.Timeout) -> None:
        self._owner, self._timeout = owner, timeout

    async def __aenter__(self) -> None:
        self._owner._scope = await self._timeout.__aenter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._owner._scope = None
        await self._timeout.__aexit__(exc_type, exc, tb)  # a TimeoutError when it expired
