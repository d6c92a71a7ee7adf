"""One visit of a fan-out, static (``wf.fanout``) or over a list (``wf.map``): starting its
branch rows, timers, join and branch pool, and applying the join's verdict.

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`), run in the task actor's
own asyncio task. The node kinds differ only in where the branches come from and where
their results land; ``actors/task/graph_runtime.py`` and ``map_runtime.py`` say that in a
:class:`Visit` and a :class:`Joined`. The join is ``fanout.py``'s, the branches' pool
``branch_pool.py``'s.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ratchet.actors.task.branch_host import BranchHost, FanoutContext
from ratchet.actors.task.branch_place import branch_partitions, place_branches, stop_branches
from ratchet.actors.task.branch_run import BranchHold, FanoutShared
from ratchet.actors.task.branch_settle import Notify
from ratchet.actors.task.branch_window import close_window, open_window
from ratchet.actors.task.fanout import (
    DEFAULT_BRANCH_CONCURRENCY,
    BranchesDone,
    JoinActor,
    JoinDone,
    ResendVerdict,
    branch_timer,
    branch_timer_id,
    window_size,
)
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import fail_with_saga
from ratchet.actors.workflow.nodes import BranchGraph, JoinPolicy
from ratchet.persistence.graph_rows import BranchWrites
from ratchet.persistence.ledger import TimerWrite
from ratchet.protocol import tracing
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.redaction import secret_values
from ratchet.protocol.subjects import branch_id, partition_of

__all__ = ["Joined", "Visit", "apply_verdict", "fanout_key", "join_notifier", "start_visit"]


#: Per task actor, the fan-out visits it started itself whose branches have committed no
#: spend of the task's budget (so far): their verdict need not read the task's spend back.
#: A visit resumed after a restart is never in it (the branches may have spent before).
_unspent: weakref.WeakKeyDictionary[TaskKernel, set[str]] = weakref.WeakKeyDictionary()


def fanout_key(actor: TaskKernel, node: str) -> str:
    # A fan-out inside a bounded loop runs once per visit: its branches are keyed by visit.
    return f"{node}#{actor.visits.get(node, 0)}"


@dataclass(frozen=True, slots=True)
class Visit:
    """The branches of one fan-out visit, as they start."""

    key: str
    node: str  # the fan-out or map node
    names: list[str]  # the branches, in order
    graph_of: Callable[[str], BranchGraph]
    inputs: Mapping[str, dict[str, Any]]  # each branch's initial state
    policy: JoinPolicy
    branch_timeout: float | None
    max_concurrency: int | None
    started: dict[str, Any]  # the ``fanout.started`` payload
    retries: int = 0  # runs again of a branch whose body raised


@dataclass(frozen=True, slots=True)
class Joined:
    """Where a verdict takes the task: the node left, its branches, and what the join made."""

    node: str  # the fan-out or map node (the task's current node)
    join: str  # the name its join events carry
    branches: list[str]
    into: str  # the state key of the results
    value: Any
    next: str


async def start_visit(actor: TaskKernel, visit: Visit,
                      rows: Mapping[str, Mapping[str, Any]]) -> None:
    """Record the visit's branch rows, timers and ``fanout.started`` unless ``rows`` (read
    from the store) shows them recorded already, then start the join and every branch
    still RUNNING: a branch that finished before a crash never runs again."""
    key, names, limit = visit.key, visit.names, visit.max_concurrency or DEFAULT_BRANCH_CONCURRENCY
    now = actor.deps.clock.now()
    # A branch's budget counts from when it gets a slot. The first ``limit`` branches get
    # theirs at once, so their timers are armed with the fan-out; each later one (and each
    # one run again after a restart) arms its own when its turn comes.
    armed: set[str] = set()
    fresh = not rows  # its rows written now: no branch has committed a step
    if fresh:
        timers = []
        if visit.branch_timeout:
            armed = set(names[:limit])
            timers += [branch_timer(actor.task_id, key, visit.node, b, now + visit.branch_timeout)
                       for b in names[:limit]]
        if visit.policy.timeout:
            timers.append(TimerWrite(f"join:{actor.task_id}:{key}", "join_timeout",
                                     now + visit.policy.timeout, {"key": key}))
        # Pipelined: the branches start while it syncs. Their settlements commit after it
        # in the same WAL, so none is durable without it; an OS crash before its sync runs
        # the fan-out again, as one before a branch settles runs that branch again.
        pack, n = actor.deps.store.secrets.pack, actor.deps.partitions
        placed = {b: (partition_of(branch_id(actor.task_id, key, b), n), pack(visit.inputs[b]))
                  for b in names}
        await actor.commit(branches=BranchWrites(key, start=names, placed=placed), timers=timers,
                           events=[(EventType.FANOUT_STARTED, visit.started)], pipelined=True)
        rows = {b: {"status": "RUNNING"} for b in names}
        _unspent.setdefault(actor, set()).add(key)
    # Only a join with a timeout has a timer that may have fired.
    fired = bool(visit.policy.timeout) and await actor.deps.store.timer_fired(
        f"join:{actor.task_id}:{key}")
    known = dict(rows)
    window = window_size(visit.max_concurrency, len(names))
    windowed = window if len(names) > window else 0  # started as others settle: branch_window.py
    specs: list[tuple[str, Any, float]] = [(f"join:{key}", lambda restarts: JoinActor(
        task_id=actor.task_id, key=key, node=visit.node, policy=visit.policy, branches=names,
        store=actor.deps.store, tell_task=actor.deps.children.tell_task, timer_fired=fired,
        # The rows just read or written, for its first start; a restarted join reads them.
        rows=None if restarts else known, window=windowed), 5.0)]
    # Finished before a crash: never run again.
    running = [b for b in names if rows.get(b, {}).get("status", "RUNNING") == "RUNNING"]
    refs = await actor.deps.children.spawn_children(actor.task_id, specs)
    actor.joins[key] = refs[0]
    refs[0].tell(ResendVerdict())  # a join that decided before we (re)started says it again
    if running:
        context = _context(actor, visit, limit, armed)
        statuses = {b: rows.get(b, {}).get("status", "RUNNING") for b in names}
        due = open_window(actor, key, names, statuses, window, context)
        if due:
            await place_branches(actor, key, due, context, fresh=fresh)
        host: BranchHost = actor.deps.branches
        if host.publish is not None and any(
                not host.owns(branch_id(actor.task_id, key, group[0]))
                for group in branch_partitions(actor, key, running).values()):
            _unspent.get(actor, set()).discard(key)  # spent on other nodes too: read it back


def _context(actor: TaskKernel, visit: Visit, limit: int, armed: set[str]) -> FanoutContext:
    """The visit as its branches see it, for the partitions this node holds (found once
    for the visit, not per branch: a copy of the input per branch was a measurable share
    of a one-step branch)."""
    assert actor.record is not None
    tenant, task_input = actor.record.tenant, dict(actor.record.input)
    deps, task_id, key = actor.deps, actor.task_id, visit.key

    async def session(name: str) -> Any:
        return await deps.children.session(task_id, tenant, name)

    host: BranchHost = deps.branches
    shared = FanoutShared(
        task_id=task_id, tenant=tenant, key=key, node=visit.node, task_input=task_input,
        input_secrets=secret_values(task_input), store=deps.store, clock=deps.clock,
        producer=deps.producer, session=session, switches=deps.switches,
        max_concurrency=limit, notify=host.notifier(task_id, key),
        # The fan-out's span, if tracing: the branches' calls are its children (the pool
        # is started by the node's branch host, in a context of its own).
        traceparent=tracing.current_traceparent(), sandbox=actor.record.sandbox, rng=deps.rng,
        spent=lambda: _unspent.get(actor, set()).discard(key), remote_ask=deps.remote_ask,
        deadline_at=actor.record.deadline_at, retries=visit.retries, hold=BranchHold())
    return FanoutContext(shared, visit.graph_of, {b: dict(v) for b, v in visit.inputs.items()},
                         visit.branch_timeout, set(armed))


def join_notifier(actor: TaskKernel, key: str) -> Notify:
    """Tells the fan-out ``key``'s live join which branches were settled (committed), by
    name: a join restarted meanwhile recounts from the store, so a notification that finds
    no join loses nothing."""
    children, task_id, join = actor.deps.children, actor.task_id, f"join:{key}"

    def notify(statuses: dict[str, str], results: dict[str, Any]) -> None:
        ref = children.lookup_child(task_id, join)
        if ref is not None:
            ref.tell(BranchesDone(statuses, results))

    return notify


async def apply_verdict(actor: TaskKernel, done: JoinDone, joined: Joined) -> None:
    """Stop the visit's join and branches, then commit the verdict: on success one move to
    ``joined.next`` with ``state[joined.into]``; on failure ``join.failed`` and the saga."""
    v = done.verdict
    summary = {"node": joined.join, "key": done.key, "ok": v.ok, "reason": v.reason,
               "succeeded": v.succeeded, "failed": v.failed, "timed_out": v.timed_out,
               "degraded": v.degraded, "cancelled": v.unfinished}
    timers = [branch_timer_id(actor.task_id, done.key, b) for b in joined.branches]
    timers.append(f"join:{actor.task_id}:{done.key}")
    settle = BranchWrites(done.key, settle={b: "CANCELLED" for b in v.unfinished})
    if joined.branches:
        await actor.deps.children.stop_children(actor.task_id, [f"join:{done.key}"])
        await stop_branches(actor, done.key, joined.branches)
    actor.joins.pop(done.key, None)
    close_window(actor, done.key)
    if not v.ok:
        await actor.commit(events=[(EventType.JOIN_FAILED, summary)], branches=settle,
                           cancel_timers=timers)
        deadline = actor.record.deadline_at if actor.record is not None else None
        if deadline is not None and actor.deps.clock.due_now() >= deadline:
            # Its branches failed at the task's deadline: the task's reason, as a step's.
            await fail_with_saga(actor, RatchetError("task deadline passed"), "deadline passed")
            return
        await fail_with_saga(actor, RatchetError(f"join {joined.join} failed: {v.reason}"),
                             "join failed")
        return
    unspent = _unspent.get(actor, set())
    if done.key in unspent:
        unspent.discard(done.key)  # its branches spent nothing: the actor's figure holds
    else:
        actor.spent = (await actor.deps.store.load_task(actor.task_id)).spent  # branches' too
    actor.state[joined.into] = joined.value
    if joined.join != joined.node:  # a static fan-out's join is a node of its own
        actor.visits[joined.join] = actor.visits.get(joined.join, 0) + 1
    # Pipelined: the task's next node runs while it syncs (its events leave once durable;
    # the verdict came in process, so no ack or reply rests on it).
    await actor.move(joined.node, joined.next, [(EventType.JOIN_COMPLETED, summary)],
                     branches=settle, cancel_timers=timers, pipelined=True)
    actor.advance()
