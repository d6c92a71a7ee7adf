"""The branches of one fan-out visit, run as asyncio tasks of one actor (:class:`BranchPool`).

A branch (``branch_run.py``: :class:`BranchRun`) is a small graph with its own state; its
progress is committed before each of its steps but the first, its result once, when it
finishes. An actor per branch gave each one a task, a mailbox, a spawn and an exit handled
by the task's supervisor, which was most of what a one-step branch cost. So a fan-out's
branches run as tasks of one pool, a child of the task's supervisor; the pool supervises
them the way that supervisor did (OTP's one-for-one, within the pool):

- a branch that raises (its body's errors are its result, ``FAILED``: what raises is a
  commit of its own) runs again after a backoff, from its last committed step;
- more than :data:`MAX_RESTARTS` runs of one branch within :data:`RESTART_PERIOD` seconds
  crash the pool, which the task's supervisor restarts (within its own intensity);
- a pool that starts again reads the branch rows and runs only the branches still
  RUNNING, each from its progress: a settled branch never runs again;
- the pool stops once every branch has ended; stopping it (the join decided, the task was
  cancelled) cancels the branches still running or waiting for a slot; holding it (the
  task pauses: :class:`HoldBranches`) stops each branch at its next safe point.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from ratchet.actors.core.actor import Actor
from ratchet.actors.core.backoff import backoff_delay
from ratchet.actors.task.branch_run import BranchHold, BranchRun
from ratchet.persistence.branch_rows import BranchProgress
from ratchet.protocol.clock import Clock

__all__ = ["MAX_RESTARTS", "RESTART_PERIOD", "STOPPING", "STOP_WAIT", "BranchPool", "HoldBranches",
           "RunBranches", "StopBranch"]

log = structlog.get_logger("ratchet.fanout")

#: A branch that crashes more often than this within RESTART_PERIOD crashes its pool (the
#: task supervisor's own intensity, which the branch actors were counted against).
MAX_RESTARTS, RESTART_PERIOD = 3, 60.0
#: Restart delay bounds of a crashed branch, seconds (the task supervisor's).
BACKOFF_BASE, BACKOFF_CAP = 0.05, 5.0
#: How long a stopping pool waits for its cancelled branches (a step that ignores its
#: cancellation is left behind: a stop stays prompt, as the 0.01 s of an actor each was).
STOP_WAIT = 0.5


@dataclass(frozen=True, slots=True)
class StopBranch:
    """Cancel this branch (its row was settled otherwise: its time budget ran out)."""

    branch: str


@dataclass(frozen=True, slots=True)
class RunBranches:
    """Run these branches too, each from its committed progress (read once for them all:
    a ``branch.start`` for a pool already running, an operator's ``retry-branch``); those
    running already are left alone. Nothing while the pool holds."""

    branches: list[str]
    fresh: bool = False  # their rows were just written: no progress to read


#: A :class:`RunBranches`' answer from a pool that has stopped itself: run them elsewhere.
STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class HoldBranches:
    """Stop every branch at its next safe point (the task pauses), waiting at most
    ``timeout`` seconds for those in a step; answers how many branches were still running
    past it (then cancelled: their step runs again when the task resumes)."""

    reason: str
    timeout: float


@dataclass(frozen=True, slots=True)
class _BranchGaveUp:
    branch: str
    error: BaseException


class BranchPool(Actor):
    """Runs the branches of one fan-out visit, each in a task of its own (module doc).

    Args:
        branches: the branches to run, in order.
        make: a run of a branch from its progress as last committed (None: from its start).
        running: None to run ``branches``; else read which of them are still RUNNING (a
            restarted pool: what settled meanwhile never runs again).
        progress: reads the committed progress of the branches named (each one run again
            after a crash; all of them at start unless ``fresh``); None: none is read.
        fresh: the fan-out's rows were just written: no branch has progress to read.
        hold: what the visit's branches read at their safe points (shared with them).
        check: reads which of the fan-out's branches are RUNNING, for :class:`RunBranches`
            (a branch that settled since its start was sent never runs again); None: not
            checked.
    """

    def __init__(self, *, branches: Iterable[str],
                 make: Callable[[str, BranchProgress | None], BranchRun],
                 clock: Clock, rng: random.Random,
                 running: Callable[[], Awaitable[set[str]]] | None = None,
                 progress: Callable[[list[str]], Awaitable[dict[str, BranchProgress]]]
                 | None = None, fresh: bool = True, hold: BranchHold | None = None,
                 check: Callable[[], Awaitable[set[str]]] | None = None) -> None:
        self.branches, self.make, self.clock, self.rng = list(branches), make, clock, rng
        self.running, self.progress, self.fresh = running, progress, fresh
        self.check = check
        self.hold = hold or BranchHold()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.adding = 0  # RunBranches being handled
        #: It stopped itself (no branch left): a RunBranches still in its mailbox is
        #: answered ``STOPPING`` (its branches would be cancelled by the stop), and the
        #: host starts a new pool for them.
        self.stopping = False

    async def on_start(self) -> None:
        """Runs in the pool's task: starts a task per branch, each from its committed
        progress. A raise (the rows unreadable) is a crash: the task's supervisor starts
        the pool again."""
        names = self.branches
        if self.running is not None:
            still = await self.running()
            names = [b for b in names if b in still]
        resumes: dict[str, BranchProgress] = {}
        if self.progress is not None and not self.fresh and names:
            resumes = await self.progress(names)
        for branch in names:
            self._start(branch, resumes.get(branch), read=False)
        if not self.tasks:
            self._idle()

    def _idle(self) -> None:
        self.stopping = True
        self.ref.stop()

    def _start(self, branch: str, resume: BranchProgress | None, read: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._supervise(branch, resume, read),
                                                      name=f"branch:{branch}")
        self.tasks[branch] = task
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: _supervise raises nothing but its cancellation
        branch = task.get_name().removeprefix("branch:")
        if self.tasks.get(branch) is task:
            del self.tasks[branch]
            if not self.tasks and not self.adding:
                self._idle()  # every branch ended: the pool's work is done

    async def _supervise(self, branch: str, resume: BranchProgress | None,
                         read: bool = False) -> None:
        """Runs ``branch`` until it settles, again after each crash (with a backoff), from
        its progress as last committed (``read``: read it first)."""
        restarts: list[float] = []
        while True:
            try:
                if (read or restarts) and self.progress is not None:
                    resume = (await self.progress([branch])).get(branch)
                await self.make(branch, resume).run()
                return
            except Exception as exc:
                if getattr(exc, "ends_actor", False):
                    # Fenced: its partition is another node's now, which runs it from its
                    # last committed step. Nothing to restart here.
                    log.info("branch fenced: its partition moved", branch=branch)
                    return
                now = self.clock.monotonic()
                restarts = [t for t in restarts if now - t < RESTART_PERIOD] + [now]
                if len(restarts) > MAX_RESTARTS:
                    self.ref.tell(_BranchGaveUp(branch, exc))
                    return
                delay = backoff_delay(len(restarts) - 1, BACKOFF_BASE, BACKOFF_CAP, self.rng)
                log.info("restarting branch", branch=branch, restarts=len(restarts),
                         delay_s=round(delay, 4), error=repr(exc))
                await self.clock.sleep(delay)

    async def receive(self, message: Any) -> Any:
        """Runs in the pool's task. ``_BranchGaveUp`` raises: the pool crashes."""
        if isinstance(message, StopBranch):
            task = self.tasks.get(message.branch)
            if task is not None:
                task.cancel()
        elif isinstance(message, RunBranches):
            if self.stopping:
                return STOPPING
            new = [b for b in dict.fromkeys(message.branches) if b not in self.tasks]
            if new and self.hold.reason is None:
                known = set(self.branches)
                self.branches += [b for b in new if b not in known]
                self.adding += 1  # the pool stays up while it reads (its last branch may end)
                try:
                    if not message.fresh and self.check is not None:
                        still = await self.check()  # read after this mail came: settled
                        new = [b for b in new if b in still and b not in self.tasks]
                    resumes = {} if message.fresh or self.progress is None or not new \
                        else await self.progress(new)
                    for branch in new:
                        if branch not in self.tasks:
                            self._start(branch, resumes.get(branch), read=False)
                finally:
                    self.adding -= 1
                    if not self.tasks:
                        self._idle()
        elif isinstance(message, HoldBranches):
            return await self._hold(message)
        elif isinstance(message, _BranchGaveUp):
            raise message.error
        else:
            return await super().receive(message)
        return None

    async def _hold(self, message: HoldBranches) -> int:
        """Runs in the pool's task (its other mail waits: nothing else is asked of a pool
        that holds). The branches in a step finish it and stop at their safe point; those
        parked (waiting for a slot or a thaw) are cancelled at once."""
        self.hold.reason = message.reason
        for branch in list(self.hold.parked):
            task = self.tasks.get(branch)
            if task is not None:
                task.cancel()
        tasks = list(self.tasks.values())
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=message.timeout)
        for task in pending:
            task.cancel()
        return len(pending)

    async def on_stop(self) -> None:
        """Runs in the pool's task: cancels the branches still running and waits for them
        (bounded: a step that ignores its cancellation is left behind, logged)."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_WAIT)
            if pending:
                log.warning("branches still running after their pool stopped",
                            branches=sorted(t.get_name() for t in pending))

