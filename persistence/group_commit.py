"""The queue of a group-commit writer thread: what callers on event loops submit, drained
into batches by the thread, and the results handed back to each caller's loop.

Shared by the writers that own their connection on a thread: SQLite's ``ThreadWriter``
(persistence/thread_writer.py) and PostgreSQL's (persistence/postgres/writer.py). A batch
takes the urgent lane first (lease renewals
must not wait behind a flood of step commits), then whatever else has queued, up to
``max_batch``.
"""

from __future__ import annotations

import asyncio
import collections
import queue
from collections.abc import Callable
from typing import Any, TypeVar

from ratchet.persistence.commit_stats import call_soon_threadsafe, settle
from ratchet.protocol.tracing import bind_context

__all__ = ["BatchQueue", "Item", "hand_back"]

T = TypeVar("T")
#: A submitted transaction function, the loop of its caller, and the caller's future.
Item = tuple[Callable[[Any], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]

_STOP = object()
_WAKE = object()  # an urgent item is waiting in the urgent lane


class BatchQueue:
    """Submissions from any event loop; batches for the one thread that drains them."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._urgent: collections.deque[Any] = collections.deque()  # thread-safe ends
        self._stopping = False

    def submit(self, fn: Callable[[Any], T], urgent: bool = False,
               bind: bool = True) -> asyncio.Future[T]:
        """Queue ``fn`` (run on the caller's loop); ``urgent``: into the next batch, ahead
        of everything queued; ``bind``: run it in the caller's context (False: the caller
        bound it already, inside a wrapper the thread must see)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if bind:
            fn = bind_context(fn)  # the caller's span, for the events it writes (if tracing)
        if urgent:
            self._urgent.append((fn, loop, fut))
            self._queue.put(_WAKE)
        else:
            self._queue.put((fn, loop, fut))
        return fut

    def control(self, marker: object) -> None:
        """Ask the thread to act before its next batch: ``next_batch`` hands ``marker`` to
        its ``on_control`` (SQLite's ThreadWriter: reset the WAL between two batches)."""
        self._urgent.append(marker)
        self._queue.put(_WAKE)

    def stop(self) -> None:
        """The thread's next :meth:`next_batch` after what is queued now returns None."""
        self._queue.put(_STOP)

    def next_batch(self, on_control: Callable[[object], None] | None = None
                   ) -> list[Item] | None:
        """Block until something is queued; the next batch ([] possible), or None once
        stopped and drained. Markers of :meth:`control` go to ``on_control`` first."""
        if self._stopping:
            return None
        first = self._queue.get()
        if first is _STOP:
            return None
        batch: list[Item] = []
        while self._urgent:
            item = self._urgent.popleft()
            if isinstance(item, tuple):
                batch.append(item)
            elif on_control is not None:
                on_control(item)
        if first is not _WAKE:
            batch.append(first)
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self._stopping = True
                break
            if item is not _WAKE:
                batch.append(item)
        return batch


def hand_back(batch: list[Item], outcomes: list[tuple[bool, Any]]) -> None:
    """Settle each item's future with its outcome ``(ok, result or exception)``: one
    ``call_soon_threadsafe`` per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for (_, loop, fut), outcome in zip(batch, outcomes, strict=True):
        by_loop.setdefault(loop, []).append((fut, outcome))
    for loop, settled in by_loop.items():
        call_soon_threadsafe(loop, settle, settled)
