"""Awaiting tasks' results: the handle ``Client.submit`` returns, and the outcomes of many
tasks read from ONE subscription (docs/protocol.md, "Awaiting results").

How, in three moves that leave no gap:

1. one push consumer on RATCHET_EVENTS (``event_feed.py``) filtered to the events of the
   tasks' lives (``task.*``, where every outcome is): for one task, its own, history
   included; for several, the tenant's, from now on (a tenant's history can be long);
2. once it exists, each task's snapshot (``get``): a task that ended before the consumer
   existed is told by its snapshot, one that ends after by the consumer;
3. the events as they come, read by :class:`OutcomeReader` (protocol/task_outcomes.py).

The alternative, one consumer per task, costs the server a consumer and the client a
subscription for each task awaited; this costs one of each, and a ``get`` per task.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from pydantic import ValidationError

from ratchet.actors.transport.event_feed import EventFeed, Refusals
from ratchet.protocol.errors import ErrorCode, InvalidMessage, RemoteError
from ratchet.protocol.events import decode_event
from ratchet.protocol.messages import Event, TaskAccepted, TaskSnapshot
from ratchet.protocol.subjects import task_life_filter
from ratchet.protocol.task_outcomes import (
    Outcome,
    OutcomeReader,
    ResultTimeout,
    TaskError,
    TaskHandedOff,
    outcome_of_snapshot,
)

__all__ = ["ResultSource", "TaskHandle", "TaskOutcome", "await_outcomes"]

log = structlog.get_logger("ratchet.client")

T = TypeVar("T")

#: Snapshots asked for at once while awaiting many tasks (each one API request).
SNAPSHOT_CONCURRENCY = 32


class ResultSource(Protocol):
    """What awaiting results needs of a client (``Client`` is one)."""

    nc: NATS
    tenant: str
    refusals: Refusals | None

    async def get(self, task_id: str) -> TaskSnapshot: ...


class TaskHandle(str):
    """A submitted task: its id (known before any answer), tenant and idempotency key.

    A handle *is* its task id — a ``str`` equal to it and hashing like it — so code that
    took ``submit``'s result for the id (dict keys, ``watch(handle)``, ``== "t-…"``,
    formatting) keeps working, and it adds what awaiting the task needs.

    ``accepted``: the node's answer to a validated (request/reply) submit — the task's
    status then and whether this submit created it; None after a JetStream publish, which
    nobody has confirmed yet."""

    tenant: str
    key: str | None
    source: ResultSource
    accepted: TaskAccepted | None

    def __new__(cls, task_id: str, tenant: str, key: str | None, source: ResultSource,
                accepted: TaskAccepted | None = None) -> TaskHandle:
        handle = super().__new__(cls, task_id)
        for name, value in (("tenant", tenant), ("key", key), ("source", source),
                            ("accepted", accepted)):
            object.__setattr__(handle, name, value)
        return handle

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a TaskHandle is immutable (cannot set {name!r})")

    @property
    def task_id(self) -> str:
        """The task's id, as a plain ``str``."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return (f"TaskHandle(task_id={self.task_id!r}, tenant={self.tenant!r}, "
                f"key={self.key!r}, accepted={self.accepted!r})")

    def __reduce__(self) -> Any:  # a copy or a pickle is the id alone: the source is live
        return (str, (self.task_id,))

    async def result(self, timeout: float | None = None) -> dict[str, Any]:
        """The task's output, once it succeeded (waits at most ``timeout`` seconds).

        Raises:
            TaskFailed: it ended FAILED (``TaskBudgetExhausted`` when a budget was spent).
            TaskCancelled: it ended CANCELLED.
            TaskHandedOff: it waits for a human (UNKNOWN, or a handoff).
            ResultTimeout: no outcome within ``timeout``; the task goes on.
        """
        async with aclosing(await_outcomes(self.source, [self], timeout)) as outcomes:
            async for outcome in outcomes:
                return outcome.result()
        raise AssertionError("await_outcomes ended without the task's outcome")

    async def status(self) -> TaskSnapshot:
        """The task's snapshot now (``ratchet status``)."""
        return await self.source.get(self.task_id)


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """How one awaited task ended: its ``output``, or its ``error`` (never both)."""

    handle: TaskHandle
    output: dict[str, Any] | None = None
    error: TaskError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def result(self) -> dict[str, Any]:
        """The output; raises the task's error if it did not succeed."""
        if self.error is not None:
            raise self.error
        return self.output or {}


class _Waiting:
    """The handles still without an outcome, by task id, and the deadline they share."""

    def __init__(self, handles: Iterable[TaskHandle], timeout: float | None) -> None:
        self.by_task: dict[str, list[TaskHandle]] = {}
        for handle in handles:
            self.by_task.setdefault(handle.task_id, []).append(handle)
        self.timeout = timeout
        self.deadline = None if timeout is None else \
            asyncio.get_running_loop().time() + timeout
        #: Tasks the node did not know when asked and that no event has named since.
        self.unknown: set[str] = set()
        #: Each task's snapshot, taken once the consumer existed.
        self.snapshots: dict[str, TaskSnapshot] = {}

    def superseded(self, task_id: str, held: Outcome) -> bool:
        """A replayed handoff the task's snapshot shows it has moved on from (a human
        approved; no event of the task's life followed, only its steps)."""
        snapshot = self.snapshots.get(task_id)
        return isinstance(held, TaskHandedOff) and snapshot is not None \
            and held.superseded_by(snapshot)

    def settle(self, task_id: str, outcome: Outcome) -> list[TaskOutcome]:
        handles = self.by_task.pop(task_id, [])
        if isinstance(outcome, TaskError):
            return [TaskOutcome(h, error=outcome) for h in handles]
        return [TaskOutcome(h, output=outcome) for h in handles]

    async def bounded(self, step: Awaitable[T]) -> T:
        """``step``, or ResultTimeout once the deadline passes (only the deadline's
        TimeoutError becomes one: another raised inside ``step`` is not the caller's)."""
        if self.deadline is None:
            return await step
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(self.deadline):
                return await step
        except TimeoutError:
            if loop.time() < self.deadline:
                raise
        pending = sorted(self.by_task)
        unknown = len(self.unknown.intersection(pending))
        hint = (f"; the node knows no task for {unknown} of them (a JetStream submit it"
                " refused makes none: submit_sync says why)") if unknown else ""
        assert self.timeout is not None
        raise ResultTimeout(self.timeout, pending, hint)


async def await_outcomes(source: ResultSource, handles: Iterable[TaskHandle],
                         timeout: float | None = None) -> AsyncGenerator[TaskOutcome, None]:
    """Each handle's outcome as its task ends, in that order, over one subscription.

    Raises:
        ResultTimeout: ``timeout`` seconds passed first (the outcomes yielded so far stand).
        InvalidMessage: a handle of another tenant than ``source``'s.
        PermissionDenied: the key may not follow the tenant's events (role subscriber).
    """
    waiting = _Waiting(handles, timeout)
    if not waiting.by_task:
        return
    tenants = {h.tenant for hs in waiting.by_task.values() for h in hs}
    if tenants != {source.tenant}:
        raise InvalidMessage("results are awaited in the client's own tenant",
                             tenant=source.tenant, handles=sorted(tenants))
    only = next(iter(waiting.by_task)) if len(waiting.by_task) == 1 else None
    feed = EventFeed(source.nc, task_life_filter(source.tenant, only), source.refusals,
                     new_only=only is None)
    try:
        await waiting.bounded(feed.start())
        found = await waiting.bounded(_snapshots(source, list(waiting.by_task)))
        for task_id, snapshot in found:
            outcome = outcome_of_snapshot(snapshot) if snapshot else None
            if snapshot is None:
                waiting.unknown.add(task_id)
            else:
                waiting.snapshots[task_id] = snapshot
            if outcome is not None:
                for done in waiting.settle(task_id, outcome):
                    yield done
        reader = OutcomeReader()
        while waiting.by_task:
            msg = await waiting.bounded(feed.next())
            event = _event(msg)
            news: list[tuple[str, Outcome]] = []
            if event is not None and event.task_id in waiting.by_task:
                waiting.unknown.discard(event.task_id)
                news = reader.read(event)
            if msg.metadata.num_pending == 0:
                news += [(task_id, held) for task_id, held in reader.caught_up()
                         if not waiting.superseded(task_id, held)]
            for task_id, outcome in news:
                for done in waiting.settle(task_id, outcome):
                    yield done
    finally:
        await feed.close()


async def _snapshots(source: ResultSource,
                     task_ids: list[str]) -> list[tuple[str, TaskSnapshot | None]]:
    """Each task's snapshot, None for a task the node does not know (not accepted yet)."""
    limit = asyncio.Semaphore(SNAPSHOT_CONCURRENCY)

    async def one(task_id: str) -> TaskSnapshot | None:
        async with limit:
            try:
                return await source.get(task_id)
            except RemoteError as exc:
                if exc.code != ErrorCode.NOT_FOUND:
                    raise
                return None

    # Every request ends before the first error is raised: none is left running.
    answers = await asyncio.gather(*(one(t) for t in task_ids), return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return [(t, a) for t, a in zip(task_ids, answers, strict=True)
            if not isinstance(a, BaseException)]


def _event(msg: Msg) -> Event | None:
    """The event a message carries; None (logged) for one that is not an event: only
    nodes publish on the events subjects, so that would be a bug, not a reason to stop."""
    try:
        return decode_event(msg.data)
    except (InvalidMessage, ValidationError) as exc:
        log.warning("undecodable event skipped", subject=msg.subject, error=str(exc)[:200])
        return None
