"""One run of one fan-out branch (:class:`BranchRun`): its slot, time budget, steps and
settlement, with its progress committed step by step and its safe points.

A branch's result is committed once, when it finishes (``branch_settle.py``). Before each
of its steps but the first it commits its progress (:meth:`BranchRun._checkpoint`: the node
it goes on at, its state and node visits, with a ``branch.step_completed`` event), so a
branch interrupted by a crash runs again from its last committed step, not from its start:
at most the step in flight runs twice. A one-step branch commits nothing but its settlement.

The point before each step is the branch's **safe point**, where it obeys its task:

- a pause (the task's ``pause`` asks the pool to hold, ``branch_pool.HoldBranches``): the
  branch stops there, RUNNING, its progress committed; the resumed task starts it again;
- a freeze of the tenant's dispatch: it waits there until thawed;
- the task's deadline: past it, the branch fails (``TimeoutError``, ``task deadline
  passed``); a step in flight is cut at the deadline too, and so are its tool calls.

A cancel needs no safe point: the task stops the pool, which cancels its branches at once.
A branch whose body raises is run again, from its last committed step, up to the fan-out's
``branch_retries`` times (each one a ``branch.retried`` event, counted on its row).
"""

from __future__ import annotations

import asyncio
import random
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import structlog

from ratchet.actors.effects.actions import ActionRunner, CallEnv, TaskSuspended
from ratchet.actors.effects.remote_tool import RemoteAsk, no_remote_tools
from ratchet.actors.effects.sandbox import runner_for
from ratchet.actors.effects.switches import Switches
from ratchet.actors.task.branch_settle import Notify, checkpoint_branch, settle_branch
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
from ratchet.persistence.records import fence_scope
from ratchet.persistence.txns import TaskChange
from ratchet.protocol import tracing
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import BranchSettled, StoreUnavailable
from ratchet.protocol.redaction import redact, secret_values

__all__ = ["BranchHold", "BranchRun", "DeadlinePassed", "FanoutShared"]

log = structlog.get_logger("ratchet.fanout")


class DeadlinePassed(TimeoutError):
    """The task's deadline passed: the branch fails, and is not retried."""


class _Held(Exception):
    """The branch stopped at its safe point for its task's pause."""


@dataclass(slots=True)
class BranchHold:
    """Why the branches of one fan-out visit stop at their next safe point (``reason``:
    ``pause``; None: they go on), and which are parked meanwhile (waiting for a slot or a
    thaw: nothing of theirs is in flight, so the pool cancels them at once)."""

    reason: str | None = None
    parked: set[str] = field(default_factory=set)


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
    deadline_at: float | None = None  # the task's (its clock's time)
    retries: int = 0  # runs again of a branch whose body raised (``branch_retries``)
    hold: BranchHold = field(default_factory=BranchHold)


class BranchRun:
    """One run of one branch: slot, time budget, body, settlement.

    Args:
        state: its initial state (a copy is kept when it may be retried).
        arm_timeout: the branch's time budget, armed as its durable timer when it gets its
            slot; None when it has none, or when the fan-out's start armed it already.
        resume: its progress as last committed (None: it committed no step yet).
    """

    __slots__ = ("arm_timeout", "attempts", "branch", "fence", "graph", "initial", "input",
                 "load_input", "resume", "secrets", "shared", "state")

    def __init__(self, shared: FanoutShared, branch: str, graph: BranchGraph,
                 state: dict[str, Any], arm_timeout: float | None,
                 resume: BranchProgress | None = None, fence: str | None = None,
                 load_input: bool = False) -> None:
        """``fence``: the branch's id when its writes carry its own partition's lease (a
        node with leases: ``persistence.records.fence_scope``), None for its task's.
        ``load_input``: its initial state is read from its row when it runs (the host's
        view of the visit did not hold it)."""
        self.shared, self.branch, self.graph = shared, branch, graph
        self.fence = fence
        self.load_input = load_input
        self.initial = dict(state) if shared.retries else state
        self.input = {**shared.task_input, "branch": branch}
        self.arm_timeout = arm_timeout
        # Its task's secrets: what its commits show is cut free of them, as the task's is.
        self.secrets = TaskSecrets(shared.task_id)
        self.secrets.note(shared.input_secrets)
        self.resume: BranchProgress | None = None
        self.state, self.attempts = state, 0
        self._resume_from(resume)

    def _resume_from(self, resume: BranchProgress | None) -> None:
        self.resume = resume
        self.attempts = resume.attempts if resume is not None else 0
        if resume is not None and resume.next_node is not None:
            self.state = resume.state
            self.secrets.note(secret_values(resume.state))
        elif self.shared.retries:
            self.state = dict(self.initial)

    async def run(self) -> None:
        """Runs in the branch's own task. Raises what a commit of its own raised (the pool
        runs it again); a cancel while it waits for its slot takes no slot."""
        sh = self.shared
        tracing.enter_task(sh.traceparent)  # its calls' spans: children of the fan-out's
        if self.fence is not None:
            fence_scope.set((self.fence,))  # in the branch's own task: its writes alone
        status, result, error = "SUCCEEDED", None, None
        if self.load_input:
            await self._load_input()
        sh.hold.parked.add(self.branch)  # until it has its slot
        try:
            async with branch_slot(sh.task_id, sh.key, sh.max_concurrency):
                sh.hold.parked.discard(self.branch)
                if self.arm_timeout is not None:
                    # Its budget starts now, not when the fan-out started.
                    await self._side_commit(timers=[branch_timer(
                        sh.task_id, sh.key, sh.node, self.branch,
                        sh.clock.now() + self.arm_timeout)])
                while True:
                    try:
                        result = await self._body()
                    except (BranchSettled, _Held):
                        return  # settled meanwhile, or held for a pause: nothing to settle
                    except TaskSuspended as signal:  # a branch cannot park the task
                        status = "FAILED"
                        error = {"type": type(signal).__name__, "message": str(signal)}
                    except Exception as exc:
                        if _not_the_branchs(exc):
                            raise  # the pool runs it again, or its partition's owner does
                        status, error = "FAILED", _error_of(exc)
                        if self.attempts < sh.retries and not isinstance(exc, DeadlinePassed):
                            try:
                                await self._retry(error)
                            except BranchSettled:
                                return  # settled meanwhile (its timeout): nothing to retry
                            status, error = "SUCCEEDED", None
                            continue
                    break
        finally:
            sh.hold.parked.discard(self.branch)
        payload: dict[str, Any] = {"key": sh.key}
        if error is not None:
            error = redact(error, self.secrets.values)
            payload["error"] = {k: v for k, v in error.items() if k != "trace"}
        payload["ran_on"] = sh.producer  # the node that ran it (placed by partition)
        await settle_branch(sh.store, sh.clock, sh.task_id, sh.key, sh.producer, sh.notify,
                            branch_settlement(sh.node, self.branch, status, payload, result,
                                              error), self.fence)

    async def _load_input(self) -> None:
        """The branch's initial state from its row (migration 24): the store is the truth
        when the view of the visit it was made from lacked it."""
        sh = self.shared
        loaded = await sh.store.branch_inputs(sh.task_id, sh.key, [self.branch])
        if self.branch not in loaded:
            raise RuntimeError(f"branch {self.branch} of {sh.key}: no initial state stored")
        self.initial, self.load_input = loaded[self.branch], False
        if self.resume is None or self.resume.next_node is None:
            self.state = dict(self.initial)

    async def _body(self) -> Any:
        sh = self.shared
        current, visits, steps = self.graph.start, dict[str, int](), 0
        if self.resume is not None and self.resume.next_node is not None:
            current, visits = self.resume.next_node, dict(self.resume.visits)
            steps = self.resume.steps
        ran = False  # a step ran since the last committed progress
        runner = runner_for(CallEnv(
            task_id=sh.task_id, tenant=sh.tenant, step_index=0, store=sh.store,
            clock=sh.clock, commit=self._side_commit, session=sh.session,
            deadline=sh.deadline_at, rng=sh.rng, switches=sh.switches,
            note_secrets=self.secrets.note, remote_ask=sh.remote_ask), sh.sandbox)
        while current != END:
            node = self.graph.node(current)
            if isinstance(node, StepNode):
                if ran:
                    # Before a step, not after one: a branch's last step commits nothing
                    # but its settlement, and the choices and routes between are replayed.
                    await self._checkpoint(current, visits, steps)
                    ran = False
                await self._safe_point()
            visits[current] = visits.get(current, 0) + 1
            if node.max_visits is not None and visits[current] > node.max_visits:
                raise RuntimeError(f"branch node {current} entered more than {node.max_visits} times")
            if isinstance(node, StepNode):
                await self._step(node, runner)
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

    async def _safe_point(self) -> None:
        """Before a step: stop for a pause, wait out a freeze, fail past the deadline."""
        sh = self.shared
        if sh.hold.reason is not None:
            raise _Held(sh.hold.reason)
        if sh.switches is not None and sh.switches.frozen_for(sh.tenant):
            sh.hold.parked.add(self.branch)  # a pause meanwhile cancels it here
            try:
                await sh.switches.wait_thawed(sh.tenant)
            finally:
                sh.hold.parked.discard(self.branch)
            if sh.hold.reason is not None:
                raise _Held(sh.hold.reason)
        if sh.deadline_at is not None and sh.clock.due_now() >= sh.deadline_at:
            raise DeadlinePassed("task deadline passed")

    async def _step(self, node: StepNode, runner: ActionRunner) -> None:
        sh = self.shared
        ctx = StepContext(task_id=sh.task_id, tenant=sh.tenant, workflow=self.graph.name,
                          step_name=node.name, step_index=0, attempt=self.attempts + 1,
                          input=self.input, state=self.state, clock=sh.clock,
                          log=log.bind(task_id=sh.task_id, branch=self.branch),
                          runner=runner, branch=self.branch,
                          beat=StepHeartbeat(sh.store, sh.clock, sh.task_id, self.branch,
                                             sh.producer))
        limit, by_deadline = node.timeout, False
        if sh.deadline_at is not None:
            left = max(sh.deadline_at - sh.clock.now(), 0.0)
            by_deadline = limit is None or left < limit
            limit = left if by_deadline else limit
        if limit is None:
            update = await node.fn(ctx)
        else:
            try:
                # A deadline on the branch's own task (one timer handle), not a task of
                # its own per step as ``wait_for`` makes.
                async with asyncio.timeout(limit):
                    update = await node.fn(ctx)
            except TimeoutError:
                if by_deadline:
                    raise DeadlinePassed("task deadline passed") from None
                raise
        if update:
            self.state.update(update)

    async def _checkpoint(self, next_node: str, visits: dict[str, int], steps: int) -> None:
        """Commit the branch's progress: it goes on at ``next_node`` with its state and
        ``visits`` as they are, ``steps`` committed (with the fan-out's other branches at
        their safe point: ``branch_settle.Checkpointer``). Pipelined: its next step runs
        while it syncs; that step's writes commit after it in the same WAL, so none is
        durable without it. Raises ``BranchSettled`` if the branch was settled meanwhile."""
        sh = self.shared
        packed = msgpack.packb(self.state, use_bin_type=True, default=sh.store.secrets.default)
        step = BranchStep(self.branch, next_node, packed, msgpack.packb(visits), steps)
        event = (EventType.BRANCH_STEP_COMPLETED.value, {
            "node": sh.node, "key": sh.key, "branch": self.branch, "steps": steps,
            "next": next_node, "ran_on": sh.producer})
        # Group-committed with the fan-out's other branches at their safe point.
        if not await checkpoint_branch(sh.store, sh.clock, sh.task_id, sh.key, sh.producer,
                                       (step, event), self.fence):
            raise BranchSettled(f"branch {self.branch} of {sh.key} is no longer running",
                                task_id=sh.task_id)

    async def _retry(self, error: dict[str, Any]) -> None:
        """Count a retry on the branch's row (with ``branch.retried``), then go on from its
        progress as committed: what the failed run changed in memory is dropped."""
        sh = self.shared
        shown = {k: v for k, v in redact(error, self.secrets.values).items() if k != "trace"}
        await self._side_commit(
            branches=BranchWrites(sh.key, retried=[self.branch]),
            events=[(EventType.BRANCH_RETRIED, {
                "node": sh.node, "key": sh.key, "branch": self.branch,
                "attempt": self.attempts + 1, "by": None, "error": shown})])
        got = await sh.store.branch_progress(sh.task_id, sh.key, [self.branch])
        self._resume_from(got.get(self.branch))

    async def _side_commit(self, **kwargs: Any) -> None:
        sh = self.shared
        if kwargs.get("spend"):
            sh.spent()
        await sh.store.apply(TaskChange(task_id=sh.task_id, expected_version=None,
                                        producer=sh.producer, now=sh.clock.now(),
                                        **self.secrets.scrub(kwargs)))


def _not_the_branchs(exc: BaseException) -> bool:
    """A failure of the node, not of the branch's work: a write fenced (its partition's
    lease lapsed or moved) or the store unreachable, in a commit of its own or in its
    calls' ledger writes. Settled FAILED, it would fail the join for a lease that lapsed
    on a loaded node (the likely cause of a map, SIGKILLed and resumed, that ended FAILED
    once under load); raised, the branch runs again from its last committed step, here or
    on the partition's owner."""
    return bool(getattr(exc, "ends_actor", False)) or isinstance(exc, StoreUnavailable)


def _error_of(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc)[:2000],
            "trace": "".join(traceback.format_exception(exc))[-2000:]}
