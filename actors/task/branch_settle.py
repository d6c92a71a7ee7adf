"""Group commit of a fan-out's branch settlements, and the join told in process.

A branch that finishes hands its settlement (row, result, event) to its fan-out's
:class:`Settler` and waits for it to be committed. The settler writes whatever has gathered
in one store transaction (``finish_branches``): the branches that end in the same loop
iteration, and those that end while the previous group commits, share one task-row update
and one writer slot instead of a whole task change each. Once the group is committed the
settler tells the join which branches it settled, with their results as stored
(``notify``): the join runs in this process, under the same task supervisor, so no mail is
needed for it, nor a read of the rows back. The settlement is committed before anyone is
told (what a crash of the process loses is a notification, never a result): a join that
(re)starts, or is nudged by the recovery sweeper, reads the branch rows.

The group's commit is *pipelined* (``synchronous=FULL``: the branches and the join go on
at the commit, while the WAL syncs): what the join decides on it is committed after it in
the same WAL, so the verdict is never durable without the settlements, and their events
leave only once they are durable. An OS crash before the sync loses both; the fan-out then
runs those branches again, as after a crash before they settled.

The flush runs in a task of the settler's own, not in a branch's actor: a branch stopped
while its settlement commits (its join decided) neither cancels the others' commit nor
leaves them waiting.

A branch's progress before each of its steps (``branch_run.py``) is group-committed the same
way by its fan-out's :class:`Checkpointer` (``record_branch_steps``): the branches that reach
their safe point together share one transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ratchet.persistence.branch_rows import BranchSettlement
from ratchet.persistence.graph_rows import BranchStep
from ratchet.persistence.ports import TaskStore
from ratchet.persistence.records import fence_scope
from ratchet.protocol.clock import Clock

__all__ = ["Checkpointer", "Notify", "Settler", "checkpoint_branch", "settle_branch"]

#: Tells a fan-out's join which branches were just settled, and how (branch -> status), with
#: their results as the store holds them (branch -> result; None but for SUCCEEDED).
Notify = Callable[[dict[str, str], dict[str, Any]], None]


class Settler:
    """The settlements of one fan-out visit (``task_id``, ``key``) waiting to be committed."""

    def __init__(self, store: TaskStore, clock: Clock, task_id: str, key: str,
                 producer: str, notify: Notify) -> None:
        self.store, self.clock, self.where = store, clock, (task_id, key)
        self.task_id, self.key, self.producer, self.notify = task_id, key, producer, notify
        self.pending: list[tuple[BranchSettlement, asyncio.Future[bool]]] = []
        self.fences: set[str] = set()  # of the pending settlements (fence_scope)
        self.flusher: asyncio.Task[None] | None = None
        self.groups = 0  # transactions written (bench and tests read it)

    def add(self, settlement: BranchSettlement, fence: str | None = None) -> asyncio.Future[bool]:
        """Queue ``settlement`` (``fence``: the branch's id when its writes carry its own
        partition's lease); the future says whether it settled the branch (False: the
        branch was settled before, e.g. by its timeout)."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.pending.append((settlement, fut))
        if fence is not None:
            self.fences.add(fence)
        if self.flusher is None:
            # Started on the next loop iteration: every branch ending in this one joins.
            self.flusher = asyncio.get_running_loop().create_task(self._flush())
        return fut

    async def _flush(self) -> None:
        try:
            while self.pending:
                group, self.pending = self.pending, []
                fences, self.fences = self.fences, set()
                # In the flusher's own task: the group checks the lease of each partition
                # its branches run on, in its one transaction.
                fence_scope.set(tuple(fences) if fences else None)
                try:
                    done = await self.store.finish_branches(
                        self.task_id, self.key, self.producer, self.clock.now(),
                        [s for s, _ in group], pipelined=True)
                except BaseException as exc:  # each branch crashes with it and runs again
                    for _, fut in group:
                        if not fut.done():
                            fut.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                self.groups += 1
                if done:
                    self.notify({s.branch: s.status for s, _ in group if s.branch in done},
                                done)
                for s, fut in group:
                    if not fut.done():
                        fut.set_result(s.branch in done)
        finally:
            self.flusher = None
            for _, fut in self.pending:  # cancelled with settlements still queued
                if not fut.done():
                    fut.set_exception(asyncio.CancelledError())
            self.pending = []
            if _settlers.get(self.where) is self:
                del _settlers[self.where]


#: (task_id, fan-out key) -> its settler; an entry lives while settlements are in flight.
_settlers: dict[tuple[str, str], Settler] = {}


async def settle_branch(store: TaskStore, clock: Clock, task_id: str, key: str, producer: str,
                        notify: Notify, settlement: BranchSettlement,
                        fence: str | None = None) -> bool:
    """Commit ``settlement`` in its fan-out's next group (``fence``: as
    :meth:`Settler.add`); True if it settled the branch.

    Raises:
        whatever the store raised for the group (the caller's actor crashes and its
        supervisor runs the branch again; a settled branch is never settled twice).
    """
    settler = _settlers.get((task_id, key))
    if settler is None:
        settler = _settlers[(task_id, key)] = Settler(store, clock, task_id, key, producer,
                                                      notify)
    return await settler.add(settlement, fence)


#: One branch's progress and its ``branch.step_completed`` event.
StepWrite = tuple[BranchStep, tuple[str, dict[str, Any]]]


class Checkpointer:
    """The progress writes of one fan-out visit's branches waiting to be committed."""

    def __init__(self, store: TaskStore, clock: Clock, task_id: str, key: str,
                 producer: str) -> None:
        self.store, self.clock, self.where = store, clock, (task_id, key)
        self.task_id, self.key, self.producer = task_id, key, producer
        self.pending: list[tuple[StepWrite, asyncio.Future[bool]]] = []
        self.fences: set[str] = set()
        self.flusher: asyncio.Task[None] | None = None

    def add(self, write: StepWrite, fence: str | None = None) -> asyncio.Future[bool]:
        """Queue ``write`` (``fence``: as :meth:`Settler.add`); the future says whether it
        was recorded (False: the branch was settled meanwhile)."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.pending.append((write, fut))
        if fence is not None:
            self.fences.add(fence)
        if self.flusher is None:
            self.flusher = asyncio.get_running_loop().create_task(self._flush())
        return fut

    async def _flush(self) -> None:
        try:
            while self.pending:
                group, self.pending = self.pending, []
                fences, self.fences = self.fences, set()
                fence_scope.set(tuple(fences) if fences else None)
                try:
                    done = await self.store.record_branch_steps(
                        self.task_id, self.key, self.producer, self.clock.now(),
                        [w for w, _ in group], pipelined=True)
                except BaseException as exc:  # each branch crashes with it and runs again
                    for _, fut in group:
                        if not fut.done():
                            fut.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for (step, _), fut in group:
                    if not fut.done():
                        fut.set_result(step.branch in done)
        finally:
            self.flusher = None
            for _, fut in self.pending:
                if not fut.done():
                    fut.set_exception(asyncio.CancelledError())
            self.pending = []
            if _checkpointers.get(self.where) is self:
                del _checkpointers[self.where]


_checkpointers: dict[tuple[str, str], Checkpointer] = {}


async def checkpoint_branch(store: TaskStore, clock: Clock, task_id: str, key: str,
                            producer: str, write: StepWrite, fence: str | None = None) -> bool:
    """Commit a branch's progress in its fan-out's next group; False if the branch was
    settled meanwhile (nothing of it written).

    Raises:
        whatever the store raised for the group (the branch's run crashes; the pool runs
        it again from its last committed step).
    """
    cp = _checkpointers.get((task_id, key))
    if cp is None:
        cp = _checkpointers[(task_id, key)] = Checkpointer(store, clock, task_id, key, producer)
    return await cp.add(write, fence)
