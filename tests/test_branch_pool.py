"""The branch pool supervises a fan-out's branches as tasks of one actor: a branch that
raises runs again after a backoff, one that keeps raising crashes the pool, a restarted
pool runs only the branches still RUNNING, and a stopped branch leaves its siblings alone."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from typing import Any

from ratchet.actors.core.actor import ActorRef, ActorSystem
from ratchet.actors.task.branch_pool import MAX_RESTARTS, BranchPool, StopBranch
from ratchet.protocol.clock import FakeClock


class _Runs:
    """Branch runs as the pool sees them: ``fail[b]`` runs of ``b`` raise (what a failing
    settlement commit does), then it ends; a branch in ``hold`` waits until released."""

    def __init__(self, fail: dict[str, int] | None = None, hold: set[str] | None = None) -> None:
        self.fail, self.hold = fail or {}, hold or set()
        self.count: Counter[str] = Counter()
        self.cancelled: set[str] = set()
        self.release = asyncio.Event()
        self.waiting: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.gone: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.resumed: defaultdict[str, list[Any]] = defaultdict(list)  # each run's progress

    def make(self, branch: str, resume: Any = None) -> Any:
        runs = self
        runs.resumed[branch].append(resume)

        class Run:
            async def run(self) -> None:
                runs.count[branch] += 1
                if runs.count[branch] <= runs.fail.get(branch, 0):
                    raise OSError(f"commit of {branch} failed")
                if branch in runs.hold:
                    runs.waiting[branch].set()
                    try:
                        await runs.release.wait()
                    except asyncio.CancelledError:
                        runs.cancelled.add(branch)
                        runs.gone[branch].set()
                        raise

        return Run()


async def _pool(runs: _Runs, branches: list[str], clock: FakeClock,
                still: set[str] | None = None
                ) -> tuple[ActorRef[Any], asyncio.Future[BaseException | None]]:
    exited: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    async def running() -> set[str]:
        assert still is not None
        return still

    pool = BranchPool(branches=branches, make=runs.make, clock=clock, rng=random.Random(7),
                      running=None if still is None else running)
    ref = ActorSystem(clock).spawn(pool, "tasks/t1/branches:spread#0",
                                   lambda _, reason: exited.set_result(reason))
    return ref, exited


async def _until(done: asyncio.Future[Any] | asyncio.Event, clock: FakeClock) -> None:
    """Let the loop run, moving the clock past each backoff, until ``done`` (bounded)."""
    async with asyncio.timeout(5):
        while not (done.is_set() if isinstance(done, asyncio.Event) else done.done()):
            if clock.sleepers:
                clock.advance(10.0)
            await asyncio.sleep(0)


async def test_a_branch_whose_settlement_fails_runs_again_and_the_pool_then_stops() -> None:
    clock, runs = FakeClock(), _Runs(fail={"a": 2})
    _, exited = await _pool(runs, ["a", "b"], clock)
    await _until(exited, clock)
    assert exited.result() is None  # every branch ended: a normal stop
    assert runs.count == {"a": 3, "b": 1}


async def test_a_branch_that_keeps_failing_crashes_the_pool_and_cancels_its_siblings() -> None:
    clock, runs = FakeClock(), _Runs(fail={"a": 100}, hold={"b"})
    _, exited = await _pool(runs, ["a", "b"], clock)
    await _until(exited, clock)
    assert isinstance(exited.result(), OSError)
    assert runs.count["a"] == MAX_RESTARTS + 1
    assert runs.cancelled == {"b"}


async def test_a_restarted_pool_runs_only_the_branches_still_running() -> None:
    clock, runs = FakeClock(), _Runs()
    _, exited = await _pool(runs, ["a", "b", "c"], clock, still={"b"})
    await _until(exited, clock)
    assert exited.result() is None and runs.count == {"b": 1}


async def test_stopping_one_branch_leaves_the_others_running() -> None:
    clock, runs = FakeClock(), _Runs(hold={"a", "b"})
    ref, exited = await _pool(runs, ["a", "b"], clock)
    async with asyncio.timeout(5):
        await runs.waiting["a"].wait()
        await runs.waiting["b"].wait()
        ref.tell(StopBranch("a"))
        await runs.gone["a"].wait()
    assert not exited.done() and runs.cancelled == {"a"}
    runs.release.set()
    await _until(exited, clock)
    assert exited.result() is None and runs.count == {"a": 1, "b": 1}


async def test_a_branch_run_again_goes_on_from_the_progress_it_committed() -> None:
    clock, runs = FakeClock(), _Runs(fail={"a": 1})
    reads: list[list[str]] = []

    async def progress(names: list[str]) -> dict[str, Any]:
        reads.append(names)
        return {"a": "after s6"}  # what the store holds: its last committed step

    exited: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    pool = BranchPool(branches=["a", "b"], make=runs.make, clock=clock, rng=random.Random(7),
                      progress=progress)  # fresh: nothing to read at start
    ActorSystem(clock).spawn(pool, "tasks/t1/branches:spread#0",
                             lambda _, reason: exited.set_result(reason))
    await _until(exited, clock)
    assert exited.result() is None
    assert runs.resumed == {"a": [None, "after s6"], "b": [None]} and reads == [["a"]]


async def test_a_pool_of_a_resumed_fanout_starts_each_branch_from_its_progress() -> None:
    clock, runs = FakeClock(), _Runs()

    async def progress(names: list[str]) -> dict[str, Any]:
        return {"b": "after s3"}

    exited: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    pool = BranchPool(branches=["a", "b"], make=runs.make, clock=clock, rng=random.Random(7),
                      progress=progress, fresh=False)
    ActorSystem(clock).spawn(pool, "tasks/t1/branches:spread#0",
                             lambda _, reason: exited.set_result(reason))
    await _until(exited, clock)
    assert runs.resumed == {"a": [None], "b": ["after s3"]}
