"""The branches of one fan-out visit, run as asyncio tasks of one actor (:class:`BranchPool`).

A branch is a small graph with its own state. Its result is committed once, when it
finishes (``branch_settle.py``); before each step but its first it commits its progress
(:meth:`BranchRun._checkpoint`: the node it goes on at, its state and node visits, with a
``branch.step_completed`` event), so a branch interrupted by a crash runs again from its last
committed step, not from its start: at most the step in flight runs twice. A one-step
branch commits nothing but its settlement. An actor per branch gave each one a task, a mailbox, a spawn and
an exit handled by the task's supervisor, which was most of what a one-step branch cost.
So a fan-out's branches run as tasks of one pool, a child of the task's supervisor; the pool
supervises them the way that supervisor did (OTP's one-for-one, within the pool):

- a branch that raises (its body's errors are its result, ``FAILED``: what raises is a
  commit of its own) runs again after a backoff, from its last committed step;
- more than :data:`MAX_RESTARTS` runs of one branch within :data:`RESTART_PERIOD` seconds
  crash the pool, which the task's supervisor restarts (within its own intensity);
- a pool that starts again reads the branch rows and runs only the branches still
  RUNNING: a settled branch never runs again;
- the pool stops once every branch has ended; stopping it (the join decided, the task was
  cancelled) cancels the branches still running or waiting for a slot.

:class:`BranchRun` is one run of one branch: it waits for a slot of its fan-out
(:func:`fanout.branch_slot`), arms its time budget, runs its graph and settles it.
"""

from __future__ import annotations

import asyncio
import random
import traceback
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
import structlog

from ratchet.actors.core.actor import Actor
from ratchet.actors.core.backoff import backoff_delay
from ratchet.actors.effects.actions import CallEnv, TaskSuspended
from ratchet.actors.effects.remote_tool import RemoteAsk, no_remote_tools
from ratchet.actors.effects.sandbox import runner_for
from ratchet.actors.effects.switches import Switches
from ratchet.actors.task.branch_settle import Notify, settle_branch
from ratchet.actors.task.fanout import branch_settlement, branch_slot, branch_timer
from ratchet.actors.task.heartbeat import StepHeartbeat
from ratchet.actors.task.task_secrets import TaskSecrets
from ratchet.actors.workflow.nodes import (
    END,
    BranchGraph,
    ChoiceNode,
    RouteNode,
    StepContext,
    StepNode,
)
from ratchet.persistence.branch_rows import BranchProgress
from ratchet.persistence.graph_rows import BranchStep, BranchWrites
from ratchet.persistence.ports import TaskStore
from ratchet.persistence.txns import TaskChange
from ratchet.protocol import tracing
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import BranchSettled
from ratchet.protocol.redaction import redact, secret_values

__all__ = ["MAX_RESTARTS", "RESTART_PERIOD", "BranchPool", "BranchRun", "FanoutShared",
           "StopBranch"]

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
class FanoutShared:
    """What the branches of one fan-out visit share (found once per visit, not per branch)."""

    task_id: str
    tenant: str
    key: str
    node: str
    task_input: dict[str, Any]
    input_secrets: set[str]  # of ``task_input``
    store: TaskStore
    clock: Clock
    producer: str
    session: Callable[[str], Awaitable[Any]]
    switches: Switches | None
    max_concurrency: int
    notify: Notify
    traceparent: str | None
    sandbox: dict[str, Any] | None
    rng: random.Random
    spent: Callable[[], None]  # called when a branch commits a spend of the task's budget
    remote_ask: RemoteAsk = no_remote_tools  # calls of remote tools (effects/remote_tool.py)


class BranchRun:
    """One run of one branch: slot, time budget, body, settlement.

    Args:
        state: its initial state (unused when it resumes).
        arm_timeout: the branch's time budget, armed as its durable timer when it gets its
            slot; None when it has none, or when the fan-out's start armed it already.
        resume: its progress as last committed (None: it committed no step yet).
    """

    __slots__ = ("arm_timeout", "branch", "graph", "input", "resume", "secrets", "shared",
                 "state")

    def __init__(self, shared: FanoutShared, branch: str, graph: BranchGraph,
                 state: dict[str, Any], arm_timeout: float | None,
                 resume: BranchProgress | None = None) -> None:
        self.shared, self.branch, self.graph = shared, branch, graph
        self.state = state if resume is None else resume.state
        self.input = {**shared.task_input, "branch": branch}
        self.arm_timeout, self.resume = arm_timeout, resume
        # Its task's secrets: what its commits show is cut free of them, as the task's is.
        self.secrets = TaskSecrets(shared.task_id)
        self.secrets.note(shared.input_secrets)
        if resume is not None:
            self.secrets.note(secret_values(resume.state))

    async def run(self) -> None:
        """Runs in the branch's own task. Raises what its settlement's commit raised (the
        pool runs it again); a cancel while it waits for its slot takes no slot."""
        sh = self.shared
        tracing.enter_task(sh.traceparent)  # its calls' spans: children of the fan-out's
        status, result, error = "SUCCEEDED", None, None
        async with branch_slot(sh.task_id, sh.key, sh.max_concurrency):
            if self.arm_timeout is not None:
                # Its budget starts now, not when the fan-out started.
                await self._side_commit(timers=[branch_timer(
                    sh.task_id, sh.key, sh.node, self.branch, sh.clock.now() + self.arm_timeout)])
            try:
                result = await self._body()
            except BranchSettled:
                return  # settled meanwhile (its timeout, its join's verdict): nothing to do
            except TaskSuspended as signal:  # a branch cannot park the task: it fails instead
                status, error = "FAILED", {"type": type(signal).__name__, "message": str(signal)}
            except Exception as exc:
                status = "FAILED"
                error = {"type": type(exc).__name__, "message": str(exc)[:2000],
                         "trace": "".join(traceback.format_exception(exc))[-2000:]}
        payload: dict[str, Any] = {"key": sh.key}
        if error is not None:
            error = redact(error, self.secrets.values)
            payload["error"] = {k: v for k, v in error.items() if k != "trace"}
        await settle_branch(sh.store, sh.clock, sh.task_id, sh.key, sh.producer, sh.notify,
                            branch_settlement(sh.node, self.branch, status, payload, result,
                                              error))

    async def _body(self) -> Any:
        sh = self.shared
        current, visits, steps = self.graph.start, dict[str, int](), 0
        if self.resume is not None:
            current, visits = self.resume.next_node, dict(self.resume.visits)
            steps = self.resume.steps
        ran = False  # a step ran since the last committed progress
        runner = runner_for(CallEnv(
            task_id=sh.task_id, tenant=sh.tenant, step_index=0, store=sh.store,
            clock=sh.clock, commit=self._side_commit, session=sh.session, deadline=None,
            rng=sh.rng, switches=sh.switches, note_secrets=self.secrets.note,
            remote_ask=sh.remote_ask), sh.sandbox)
        while current != END:
            node = self.graph.node(current)
            if ran and isinstance(node, StepNode):
                # Before a step, not after one: a branch's last step commits nothing but
                # its settlement, and the choices and routes between steps are replayed.
                await self._checkpoint(current, visits, steps)
                ran = False
            visits[current] = visits.get(current, 0) + 1
            if node.max_visits is not None and visits[current] > node.max_visits:
                raise RuntimeError(f"branch node {current} entered more than {node.max_visits} times")
            if isinstance(node, StepNode):
                ctx = StepContext(task_id=sh.task_id, tenant=sh.tenant,
                                  workflow=self.graph.name, step_name=node.name, step_index=0,
                                  attempt=1, input=self.input, state=self.state, clock=sh.clock,
                                  log=log.bind(task_id=sh.task_id, branch=self.branch),
                                  runner=runner, branch=self.branch,
                                  beat=StepHeartbeat(sh.store, sh.clock, sh.task_id,
                                                     self.branch, sh.producer))
                if node.timeout is not None:
                    # A deadline on the branch's own task (one timer handle), not a task
                    # of its own per step as ``wait_for`` makes.
                    async with asyncio.timeout(node.timeout):
                        update = await node.fn(ctx)
                else:
                    update = await node.fn(ctx)
                if update:
                    self.state.update(update)
                current, steps, ran = node.next, steps + 1, True
            elif isinstance(node, ChoiceNode):
                target = node.guard(self.state)
                if target not in node.targets:
                    raise RuntimeError(f"guard of {node.name} chose undeclared target {target!r}")
                current = target
            elif isinstance(node, RouteNode):
                current = node.table.get(node.key(self.state), node.default or END)
            else:  # validation keeps other kinds out of branches
                raise RuntimeError(f"{node.kind} node {node.name} cannot run in a branch")
        return self.state.get("output", self.state)

    async def _checkpoint(self, next_node: str, visits: dict[str, int], steps: int) -> None:
        """Commit the branch's progress: it goes on at ``next_node`` with its state and
        ``visits`` as they are, ``steps`` committed. Pipelined: its next step runs while it
        syncs; that step's writes commit after it in the same WAL, so none is durable
        without it. Raises ``BranchSettled`` if the branch was settled meanwhile."""
        sh = self.shared
        packed = msgpack.packb(self.state, use_bin_type=True, default=sh.store.secrets.default)
        await self._side_commit(
            branches=BranchWrites(sh.key, steps=[BranchStep(
                self.branch, next_node, packed, msgpack.packb(visits), steps)]),
            events=[(EventType.BRANCH_STEP_COMPLETED, {
                "node": sh.node, "key": sh.key, "branch": self.branch, "steps": steps,
                "next": next_node})],
            pipelined=True)

    async def _side_commit(self, **kwargs: Any) -> None:
        sh = self.shared
        if kwargs.get("spend"):
            sh.spent()
        await sh.store.apply(TaskChange(task_id=sh.task_id, expected_version=None,
                                        producer=sh.producer, now=sh.clock.now(),
                                        **self.secrets.scrub(kwargs)))


@dataclass(frozen=True, slots=True)
class StopBranch:
    """Cancel this branch (its row was settled otherwise: its time budget ran out)."""

    branch: str


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
    """

    def __init__(self, *, branches: Iterable[str],
                 make: Callable[[str, BranchProgress | None], BranchRun],
                 clock: Clock, rng: random.Random,
                 running: Callable[[], Awaitable[set[str]]] | None = None,
                 progress: Callable[[list[str]], Awaitable[dict[str, BranchProgress]]]
                 | None = None, fresh: bool = True) -> None:
        self.branches, self.make, self.clock, self.rng = list(branches), make, clock, rng
        self.running, self.progress, self.fresh = running, progress, fresh
        self.tasks: dict[str, asyncio.Task[None]] = {}

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
        loop = asyncio.get_running_loop()
        for branch in names:
            task = loop.create_task(self._supervise(branch, resumes.get(branch)),
                                    name=f"branch:{branch}")
            self.tasks[branch] = task
            task.add_done_callback(self._ended)
        if not self.tasks:
            self.ref.stop()

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: _supervise raises nothing but its cancellation
        branch = task.get_name().removeprefix("branch:")
        if self.tasks.get(branch) is task:
            del self.tasks[branch]
            if not self.tasks:
                self.ref.stop()  # every branch ended: the pool's work is done

    async def _supervise(self, branch: str, resume: BranchProgress | None) -> None:
        """Runs ``branch`` until it settles, again after each crash (with a backoff), from
        its progress as last committed."""
        restarts: list[float] = []
        while True:
            try:
                if restarts and self.progress is not None:
                    resume = (await self.progress([branch])).get(branch)
                await self.make(branch, resume).run()
                return
            except Exception as exc:
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
        elif isinstance(message, _BranchGaveUp):
            raise message.error
        else:
            return await super().receive(message)
        return None

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
