"""Following one task's events in sequence order (``Client.watch``), though they may reach
the stream out of order.

A task's events are numbered per task (``sequence``, contiguous from 1) by the store, but
published by the outbox relay of the node that committed them: a fan-out whose branches
run on several nodes (docs/architecture.md, "Fan-out branches: where they run") has its
events published by several relays, so on ``ratchet.events.…`` a branch's event may come
after later ones of the task — its terminal event included. The watch therefore holds
what comes early (:class:`EventOrder`, a reorder buffer) and yields strictly by sequence:

- an event is yielded once every earlier sequence has been; a repeat is dropped;
- a gap that does not fill within ``gap_timeout`` seconds (a relay that is slow, or a node
  that died before publishing: its partition's next owner publishes its outbox later) is
  filled from the store, the truth, through the admin verb ``history`` (role viewer);
- if that fails too (the key may not read history, no node answers), the missing
  sequences are skipped with a logged warning and the watch goes on: a watcher follows a
  task to its end rather than raising at a late relay. The store keeps every event; a
  caller that needs each one reads ``history`` itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import structlog

from ratchet.actors.transport.event_feed import EventFeed
from ratchet.protocol.errors import NotFound, RatchetError
from ratchet.protocol.events import decode_event
from ratchet.protocol.messages import Event
from ratchet.protocol.task_outcomes import TERMINAL_EVENTS

__all__ = ["GAP_TIMEOUT_S", "EventOrder", "History", "follow"]

log = structlog.get_logger("ratchet.client")

#: Seconds a watch waits for a missing sequence before it reads it from the store.
GAP_TIMEOUT_S = 2.0
#: Events read per ``history`` request (the verb's bound is 5,000).
_PAGE = 1000

#: Reads a task's stored events after a sequence: ``(task_id, after, limit) -> events``.
History = Callable[[str, int, int], Awaitable[list[Event]]]


class EventOrder:
    """A reorder buffer for one task's events: what came early waits for what is missing.

    Pure (no I/O, time given): ``add`` what arrives, ``pop`` what may be yielded now.

    Args:
        after: the last sequence already seen; the next yielded is ``after + 1``.
    """

    def __init__(self, after: int = 0) -> None:
        self.next = after + 1
        self._held: dict[int, Event] = {}
        #: When the current gap was found (``next`` missing, later ones held); None if none.
        self.gap_since: float | None = None

    def add(self, event: Event, now: float) -> None:
        """Hold ``event`` until its turn (dropped: a repeat, or one already yielded)."""
        if event.sequence < self.next:
            return
        self._held.setdefault(event.sequence, event)
        self._mark(now)

    def pop(self, now: float) -> Event | None:
        """The next event in sequence, if it is here (else None)."""
        event = self._held.pop(self.next, None)
        if event is None:
            return None
        self.next += 1
        self.gap_since = None
        self._mark(now)
        return event

    def gap(self) -> tuple[int, int] | None:
        """The sequences missing before the first held one, ``(first, last)``; None if
        nothing is held (no gap: the watch merely waits for the next event)."""
        if not self._held or self.next in self._held:
            return None
        return (self.next, min(self._held) - 1)

    def skip(self) -> tuple[int, int] | None:
        """Give up on the current gap: the next yielded is the first held event. Returns
        the sequences skipped."""
        missing = self.gap()
        if missing is not None:
            self.next = missing[1] + 1
        self.gap_since = None
        return missing

    def _mark(self, now: float) -> None:
        if self.gap_since is None and self._held and self.next not in self._held:
            self.gap_since = now


async def follow(feed: EventFeed, task_id: str, after: int, *, follow_terminal: bool,
                 idle_timeout: float | None, history: History,
                 gap_timeout: float = GAP_TIMEOUT_S, known: bool | None = True,
                 missing_after: float | None = None,
                 not_found: Callable[[bool | None], NotFound] | None = None,
                 ) -> AsyncGenerator[Event, None]:
    """Yield ``task_id``'s events from ``feed`` in sequence order, from ``after + 1`` (module
    doc). ``idle_timeout`` bounds the wait for each next event (TimeoutError); while
    ``known`` is not True, the first event must come within ``missing_after`` or
    ``not_found(known)`` is raised. The caller closes ``feed``."""
    loop = asyncio.get_running_loop()
    order = EventOrder(after)
    # One pending read of the feed at a time, kept across timeouts: cancelling a read to
    # look at a gap could drop the message it was taking.
    reading: asyncio.Task[Any] | None = None
    try:
        while True:
            while (event := order.pop(loop.time())) is not None:
                yield event
                if event.type in TERMINAL_EVENTS and not follow_terminal:
                    return
            # Arrived already: no task nor timer to wait for it. Not while a read is pending,
            # which would take the next message after this one (the feed's order check).
            msg = await feed.buffered() if reading is None else None
            if msg is None:
                wait = idle_timeout if known else missing_after
                if order.gap_since is not None:
                    left = max(0.0, order.gap_since + gap_timeout - loop.time())
                    wait = left if wait is None else min(wait, left)
                reading = reading or asyncio.ensure_future(feed.next())
                done, _ = await asyncio.wait({reading}, timeout=wait)
                if not done:
                    if order.gap_since is not None and \
                            loop.time() >= order.gap_since + gap_timeout:
                        await _fill(order, task_id, history, loop.time())
                        continue
                    if known:
                        raise TimeoutError(f"no event of {task_id} within {wait:g} s")
                    assert not_found is not None
                    raise not_found(known)
                msg, reading = reading.result(), None
            known = True
            order.add(decode_event(msg.data), loop.time())
    finally:
        if reading is not None:
            reading.cancel()


async def _fill(order: EventOrder, task_id: str, history: History, now: float) -> None:
    """The gap's events from the store; failing that, the gap skipped (module doc)."""
    missing = order.gap()
    if missing is None:
        return
    first, last = missing
    after = first - 1
    try:
        while after < last:
            page = await history(task_id, after, min(_PAGE, last - after))
            for event in page:
                order.add(event, now)
            if not page or page[-1].sequence <= after:
                break
            after = page[-1].sequence
    except (RatchetError, TimeoutError) as exc:
        log.warning("events missing; history not read", task_id=task_id,
                    missing=[first, last], error=repr(exc))
    if order.gap() is not None:  # the store did not have them either, or was not read
        log.warning("events skipped: not on the stream in time, nor read from the store",
                    task_id=task_id, missing=[first, last])
        order.skip()
