"""A node's share of fan-out branches (:class:`BranchHost`): it runs the branches placed on
the partitions it holds, whichever node runs their task.

A branch's partition is ``CRC-32(<task_id>/<fan-out key>/<branch>) mod P``
(``protocol.subjects.branch_id``), recorded on its row with its initial state (migration
24). Its task asks the partition's owner to run it with a ``branch.start`` mail on that
partition (``ratchet.mail.<partition>.<task_id>.branches``), one mail per partition for
all the fan-out's branches placed there; the owner's mail router hands it to this host.
When the task's own node holds the partition the host is called directly (:meth:`send`):
no NATS round trip, the task's view of the visit comes along, nothing more is read.

The host runs the branches of one fan-out visit in one :class:`BranchPool`, spawned by it
(per task and fan-out key, on this node), each branch from its progress as last committed:

- its writes carry the lease of *its* partition (``persistence.records.fence_scope``), and
  are grouped by partition; a node that loses the partition is refused its next write, and
  the branch ends there (its new owner runs it);
- a settled group is told to the fan-out's join: in process when the join runs here, else
  as ``branch.done`` mail to the task (the join reads the rows before it counts them);
- ``branch.hold`` (the task pauses) stops them at their next safe point, ``branch.stop``
  (the join decided, the task ended, a branch timed out) cancels them;
- a node that takes a partition over (:meth:`BranchHost.resume`) runs the RUNNING branches
  placed there whose task is RUNNING, from their last committed step.

A start for a branch already running here is a no-op (the pool keeps one run per branch):
a task that restarts sends its starts again, and a takeover may find the same branches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from ratchet.actors.core.actor import ActorRef, ActorSystem
from ratchet.actors.core.keyed_lock import KeyedLock
from ratchet.actors.task.branch_pool import (
    STOP_WAIT,
    STOPPING,
    BranchPool,
    HoldBranches,
    RunBranches,
    StopBranch,
)
from ratchet.actors.task.branch_run import BranchHold, BranchRun, FanoutShared
from ratchet.actors.task.branch_sessions import BranchSessions
from ratchet.actors.task.deps import TaskDeps
from ratchet.actors.task.fanout import (
    DEFAULT_BRANCH_CONCURRENCY,
    BranchesDone,
    started_in_window,
)
from ratchet.actors.workflow.map_node import MapNode
from ratchet.actors.workflow.nodes import BranchGraph, FanoutNode
from ratchet.persistence.branch_rows import BranchProgress
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.errors import ActorStopped, AskTimeout
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import Envelope
from ratchet.protocol.redaction import secret_values
from ratchet.protocol.subjects import branch_id, branch_mail_subject, mail_subject, partition_of

__all__ = ["BranchHost", "FanoutContext", "Publish", "branch_mail"]

log = structlog.get_logger("ratchet.fanout")

#: Publish a sealed mail envelope on a subject (the node's; None without NATS).
Publish = Callable[[str, Envelope], Coroutine[Any, Any, None]]
#: Crashes of one fan-out's pool within RESTART_PERIOD before the host gives up on it (its
#: branches stay RUNNING: the task's next start, or the next owner, runs them).
MAX_POOL_RESTARTS, RESTART_PERIOD = 3, 60.0


@dataclass(slots=True)
class FanoutContext:
    """What one fan-out visit's branches need on a node: found once, from the task actor
    that started them (the same node) or from the store (any other)."""

    shared: FanoutShared
    graph_of: Callable[[str], BranchGraph]
    inputs: dict[str, dict[str, Any]]
    branch_timeout: float | None
    armed: set[str] = field(default_factory=set)  # whose timers the fan-out's start armed


def branch_mail(kind: MessageType, task_id: str, key: str, branches: list[str] | None,
                **body: Any) -> Envelope:
    """A branch mail envelope: correlation id = the (first) branch's id."""
    first = branches[0] if branches else "*"
    return Envelope(type=kind, message_id=new_id("msg"),
                    correlation_id=branch_id(task_id, key, first)[:128],
                    body={"task_id": task_id, "key": key, "branches": branches, **body})


class BranchHost:
    """Runs the branches placed on this node's partitions (module doc). Args:
        system: where the pools are spawned (named ``branches/<task_id>/<key>``).
        deps: the node's task deps (store, clock, registry, children: the joins here).
        owns: whether this node holds the partition of an id (a task's or a branch's).
        fenced: branch writes carry their own partition's lease (a node with leases).
    """

    def __init__(self, system: ActorSystem, deps: TaskDeps, owns: Callable[[str], bool],
                 fenced: bool = False) -> None:
        self.system, self.deps, self.owns, self.fenced = system, deps, owns, fenced
        self.publish: Publish | None = None
        self.pools: dict[tuple[str, str], ActorRef[BranchPool]] = {}
        self.pool_of: dict[ActorRef[Any], BranchPool] = {}
        self.contexts: dict[tuple[str, str], FanoutContext] = {}
        self.restarts: dict[tuple[str, str], list[float]] = {}
        self._locks: KeyedLock[tuple[str, str]] = KeyedLock()
        self.sessions = BranchSessions(system, deps)  # of branches run for other nodes
        self.ran = 0  # branch runs started here (tests, bench)

    # -- the task's side -----------------------------------------------------------------

    async def send(self, task_id: str, partition: int, env: Envelope,
                   context: FanoutContext | None = None) -> Any:
        """Deliver ``env`` to the owner of ``partition``: this host, directly, when it is
        this node (``context``: the task's view of the visit, for a start), else as mail
        on that partition. Returns the host's answer when handled here, else None."""
        if env.type == MessageType.BRANCH_STOP and env.body.get("branches") is None:
            self.sessions.spread.discard(task_id)  # the visit is over
        if self.holds(partition):
            return await self.handle(env, context)
        if env.type == MessageType.BRANCH_START:
            self.sessions.spread_to_others(task_id)
        assert self.publish is not None
        await self.publish(branch_mail_subject(task_id, partition), env)
        return None

    def holds(self, partition: int) -> bool:
        """Whether this node runs what is placed on ``partition`` (all, without NATS)."""
        return self.publish is None or self.owns(_probe_id(partition, self.deps.partitions))

    # -- the partition's side ------------------------------------------------------------

    async def handle(self, env: Envelope, context: FanoutContext | None = None) -> Any:
        """Runs in the mail router's delivery task (or the sending task actor's). Raises
        what the store raised (the mail is then redelivered)."""
        body = env.body
        task_id, key = str(body.get("task_id", "")), str(body.get("key", ""))
        names = body.get("branches")
        branches = [str(b) for b in names] if isinstance(names, list) else None
        if env.type == MessageType.BRANCH_START and branches:
            return await self._start(task_id, key, branches, body, context)
        if env.type == MessageType.BRANCH_HOLD:
            return await self._hold(task_id, key, str(body.get("reason", "pause")),
                                    float(body.get("timeout", 30.0)))
        if env.type == MessageType.BRANCH_STOP:
            await self._stop(task_id, key, branches)
            return "stopped"
        return "ignored"

    async def _start(self, task_id: str, key: str, branches: list[str],
                     body: Mapping[str, Any], context: FanoutContext | None) -> str:
        where = (task_id, key)
        async with self._locks.hold(where):
            ctx = self.contexts.get(where) if context is None else context
            if ctx is None:
                ctx = await self._context(task_id, key, set(map(str, body.get("armed") or ())))
                if ctx is None:
                    return "task not running"
            self.contexts[where] = ctx
            missing = [b for b in branches if b not in ctx.inputs]
            if missing:
                ctx.inputs.update(await self.deps.store.branch_inputs(task_id, key, missing))
            pool = self.pools.get(where)
            if pool is not None and pool.is_alive and self.pool_of[pool].hold.reason is not None:
                await pool.stop_and_wait(STOP_WAIT + 1.0)  # held: its successor runs them
            if pool is not None and pool.is_alive:
                try:
                    answer = await pool.ask(RunBranches(branches, bool(body.get("fresh"))),
                                            timeout=30.0)
                    if answer != STOPPING:
                        return "started"
                except ActorStopped:
                    pass
                # It ended, or is ending (its last branch settled): a new one runs them.
            self._spawn(where, ctx, branches, fresh=bool(body.get("fresh")))
            return "started"

    def _spawn(self, where: tuple[str, str], ctx: FanoutContext, branches: list[str],
               fresh: bool) -> None:
        task_id, key = where
        shared = dataclasses.replace(ctx.shared, hold=BranchHold())
        store = self.deps.store

        def make(branch: str, resume: BranchProgress | None) -> BranchRun:
            self.ran += 1
            arm = None if branch in ctx.armed else ctx.branch_timeout
            ctx.armed.discard(branch)  # run again: it arms its own
            fence = branch_id(task_id, key, branch) if self.fenced else None
            current = self.contexts.get(where)  # started after this pool: loaded there
            state = ctx.inputs.get(branch, current.inputs.get(branch) if current else None)
            return BranchRun(shared, branch, ctx.graph_of(branch), dict(state or {}), arm,
                             resume, fence, load_input=state is None)

        async def progress(names: list[str]) -> dict[str, BranchProgress]:
            return await store.branch_progress(task_id, key, names)

        async def running() -> set[str]:
            return await store.running_branches(task_id, key)

        # Not fresh: the start may be older than a settlement (a task's start sent again,
        # a takeover's scan), so only the branches still RUNNING run.
        pool = BranchPool(branches=branches, make=make, clock=self.deps.clock,
                          rng=self.deps.rng, running=None if fresh else running,
                          progress=progress, fresh=fresh, hold=shared.hold, check=running)
        name = f"branches/{task_id}/{key}"
        old = self.system.lookup(name)
        if old is not None:  # a pool stopping (held, or its last branch ending)
            name = f"{name}/{new_id('p')}"
        ref = self.pools[where] = self.system.spawn(pool, name, on_exit=self._exited(where))
        self.pool_of[ref] = pool

    def _exited(self, where: tuple[str, str]) -> Callable[[ActorRef[Any], BaseException | None],
                                                          None]:
        def exited(ref: ActorRef[Any], reason: BaseException | None) -> None:
            pool = self.pool_of.pop(ref, None)
            if self.pools.get(where) is not ref or pool is None:
                return
            del self.pools[where]
            if not any(task_id == where[0] for task_id, _ in self.pools):
                self.sessions.release(where[0])
            if reason is None:
                self.contexts.pop(where, None)
                return
            now = self.deps.clock.monotonic()
            recent = [t for t in self.restarts.get(where, []) if now - t < RESTART_PERIOD]
            self.restarts[where] = [*recent, now]
            if len(recent) >= MAX_POOL_RESTARTS:
                log.error("branch pool gave up", task_id=where[0], key=where[1],
                          error=repr(reason))
                self.contexts.pop(where, None)
                return
            names = list(pool.branches)
            asyncio.get_running_loop().create_task(self._restart(where, names))

        return exited

    async def _restart(self, where: tuple[str, str], names: list[str]) -> None:
        """A crashed pool's branches still RUNNING, again from their progress."""
        try:
            rows = await self.deps.store.branches(*where)
            running = [b for b in names if rows.get(b, {}).get("status") == "RUNNING"]
            if running:
                await self._start(where[0], where[1], running, {}, None)
        except Exception as exc:  # the task's next start, or the next owner, runs them
            log.warning("branch pool not restarted", task_id=where[0], key=where[1],
                        error=repr(exc))

    async def _hold(self, task_id: str, key: str, reason: str, timeout: float) -> int:
        pool = self.pools.get((task_id, key))
        if pool is None or not pool.is_alive:
            return 0
        try:
            late: int = await pool.ask(HoldBranches(reason, timeout), timeout=timeout + 5.0)
            return late
        except (ActorStopped, AskTimeout):
            return 0  # ended meanwhile, or stuck: a stop cancels it

    async def _stop(self, task_id: str, key: str, branches: list[str] | None) -> None:
        pool = self.pools.get((task_id, key))
        if pool is None or not pool.is_alive:
            return
        if branches is None:
            await pool.stop_and_wait(STOP_WAIT + 1.0)
            return
        for branch in branches:
            pool.tell(StopBranch(branch))

    async def release(self, partitions: set[int]) -> None:
        """Cancel the branches of ``partitions`` (their lease was lost or handed over: the
        new owner runs them from their last committed step, and calls their task's
        sessions there)."""
        for (task_id, key), pool in list(self.pools.items()):
            for branch in list(self.pool_of[pool].tasks) if pool in self.pool_of else []:
                if partition_of(branch_id(task_id, key, branch),
                                self.deps.partitions) in partitions:
                    pool.tell(StopBranch(branch))
                    self.sessions.spread_to_others(task_id)

    async def resume(self, partitions: set[int]) -> int:
        """Run the RUNNING branches placed on ``partitions`` (just acquired) whose task is
        RUNNING, each from its last committed step; returns how many were asked to."""
        placed = await self.deps.store.placed_branches(partitions)
        count = 0
        for (task_id, key), names in placed.items():
            try:
                names = await self._turn_came(task_id, key, names)
                if names:
                    await self._start(task_id, key, names, {}, None)
                count += len(names)
            except Exception as exc:  # the task's next start runs them
                log.warning("branches not resumed", task_id=task_id, key=key,
                            error=repr(exc))
        if count:
            log.info("resuming branches", count=count, partitions=sorted(partitions))
        return count

    async def _turn_came(self, task_id: str, key: str, names: list[str]) -> list[str]:
        """Of ``names`` (RUNNING, placed here), those the task has started: the visit's
        window (actors/task/branch_window.py) follows from its rows' statuses."""
        record = await self.deps.store.load_task(task_id)
        node = self.deps.registry.get(record.workflow, record.workflow_version).node(
            key.rpartition("#")[0])
        rows = await self.deps.store.branches(task_id, key)
        due = set(started_in_window(node, rows))
        return [b for b in names if b in due]

    # -- what a branch run here needs ----------------------------------------------------

    async def _context(self, task_id: str, key: str, armed: set[str]) -> FanoutContext | None:
        """The visit's context from the store (its task runs on another node); None when
        the task is not RUNNING (paused, ended: its branches wait for its next start)."""
        deps = self.deps
        record = await deps.store.load_task(task_id)
        if record.status != "RUNNING":
            return None
        workflow = deps.registry.get(record.workflow, record.workflow_version)
        node = workflow.node(key.rpartition("#")[0])
        if isinstance(node, MapNode):
            graph = node.branch
            graph_of: Callable[[str], BranchGraph] = lambda _: graph  # noqa: E731
            timeout, limit, retries = node.item_timeout, node.max_concurrency, node.item_retries
        elif isinstance(node, FanoutNode):
            graph_of = node.branches.__getitem__
            timeout, limit, retries = node.branch_timeout, node.max_concurrency, \
                node.branch_retries
        else:
            return None
        task_input = dict(record.input)

        async def session(name: str) -> Any:
            return await self.sessions.session(task_id, record.tenant, name)

        shared = FanoutShared(
            task_id=task_id, tenant=record.tenant, key=key, node=node.name,
            task_input=task_input, input_secrets=secret_values(task_input), store=deps.store,
            clock=deps.clock, producer=deps.producer, session=session,
            switches=deps.switches, max_concurrency=limit or DEFAULT_BRANCH_CONCURRENCY,
            notify=self.notifier(task_id, key), traceparent=None, sandbox=record.sandbox,
            rng=deps.rng, spent=_nothing, remote_ask=deps.remote_ask,
            deadline_at=record.deadline_at, retries=retries)
        return FanoutContext(shared, graph_of, {}, timeout, armed)

    def notifier(self, task_id: str, key: str) -> Callable[[dict[str, str], dict[str, Any]],
                                                          None]:
        """Tells the fan-out's join which branches settled: in process when it runs here,
        else as ``branch.done`` mail to the task's partition (published in the background:
        the settlement is committed, and a lost notice is recounted from the rows)."""
        children, join = self.deps.children, f"join:{key}"

        def notify(statuses: dict[str, str], results: dict[str, Any]) -> None:
            ref = children.lookup_child(task_id, join)
            if ref is not None:
                ref.tell(BranchesDone(statuses, results))
                return
            if self.publish is None:
                return
            env = branch_mail(MessageType.BRANCH_DONE, task_id, key, list(statuses),
                              statuses=statuses)
            subject = mail_subject(task_id, "task", self.deps.partitions)
            task = asyncio.get_running_loop().create_task(self.publish(subject, env))
            _background.add(task)
            task.add_done_callback(_published)

        return notify


_background: set[asyncio.Task[None]] = set()


def _published(task: asyncio.Task[None]) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("branch.done not published (the join recounts)",
                    error=repr(task.exception()))


def _nothing() -> None:
    """A remote branch's spend: the task's verdict reads the task's spend back."""


_probes: dict[tuple[int, int], str] = {}


def _probe_id(partition: int, partitions: int) -> str:
    """An id whose partition is ``partition`` (``owns`` takes ids, not partitions)."""
    found = _probes.get((partition, partitions))
    if found is None:
        found = _probes[(partition, partitions)] = next(
            f"p{i}" for i in itertools.count() if partition_of(f"p{i}", partitions) == partition)
    return found
