"""Fan-out / fan-in: a pool runs the branches; a join actor applies the policy.

A branch is a small graph (steps, choices, routes) with its own state. It is the unit of
recovery: its progress is committed before each of its steps but the first, its result
once, when it finishes, with its event; a branch interrupted by a crash goes on after its
last committed step, a finished one never runs again. The branches
of a fan-out visit run as tasks of one actor (``actors/task/branch_pool.py``), which
supervises them. Branch commits are side-channel changes (no compare-and-set on the task),
so branches never conflict with each other; the branches of a fan-out that finish together
are settled in one transaction (``actors/task/branch_settle.py``), which then tells the
join, in process, which branches it settled.

The join keeps its completion set in the store (the ``branches`` rows): on (re)start it
recounts them; then it counts what the settler tells it (committed settlements) and, once
those counts say the policy may decide, reads the rows once and decides on what the store
holds. A ``branch.done`` mail (from a node of an earlier release, or forged) is only a
nudge: the join reads that branch's row before it counts it. Repeats and out-of-order
notifications change nothing a set does not already hold.

At most ``max_concurrency`` branches of one fan-out run their body at once, in the whole
cluster: the task starts them through a window (actors/task/branch_window.py; which were
started follows from the rows: :func:`started`), and on a node each started branch waits
for a slot of its fan-out's :func:`branch_slot`. A fan-out that sets none has no window
(:func:`window_size`): every branch is started where it is placed, and each node runs at
most ``DEFAULT_BRANCH_CONCURRENCY`` of them at once — a bound for the node's neighbours,
not a property of the workflow, so more nodes run more of them. A waiting branch holds no slot, so stopping it (the join
decided, the task was cancelled) is as prompt as for a running one. A branch's time budget
counts from when it gets its slot.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import structlog

from ratchet.actors.core.actor import Actor
from ratchet.actors.workflow.join_policy import JoinVerdict, decide, may_decide
from ratchet.actors.workflow.map_node import MapNode
from ratchet.actors.workflow.nodes import FanoutNode, JoinPolicy
from ratchet.persistence.branch_rows import BranchSettlement
from ratchet.persistence.ledger import TimerWrite
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.catalogue import EventType

__all__ = ["DEFAULT_BRANCH_CONCURRENCY", "BranchDone", "BranchesDone", "JoinActor", "JoinDone",
           "JoinTimeout", "ResendVerdict", "WindowMoved", "branch_order", "branch_settlement",
           "branch_slot", "branch_timer", "branch_timer_id", "started", "started_in_window",
           "window_end", "window_size"]

log = structlog.get_logger("ratchet.fanout")

#: Branches of one fan-out running their body at once, when the fan-out sets no
#: ``max_concurrency``: bounds what one wide task takes from its neighbours on the node.
DEFAULT_BRANCH_CONCURRENCY = 64


@dataclass(slots=True)
class _Gate:
    slots: asyncio.Semaphore
    users: int = 0  # branches holding or waiting for a slot


#: (task_id, fan-out key) -> its gate; an entry lives while a branch holds or awaits a slot.
_gates: dict[tuple[str, str], _Gate] = {}


class _Slot:
    """``async with``: one slot of a gate (a class, not a generator-based context manager:
    every branch enters one, and the generator's machinery was a measurable share of a
    one-step branch)."""

    __slots__ = ("gate", "where")

    def __init__(self, task_id: str, key: str, limit: int) -> None:
        self.where = (task_id, key)
        gate = _gates.get(self.where)
        if gate is None:
            gate = _gates[self.where] = _Gate(asyncio.Semaphore(limit))
        self.gate = gate

    async def __aenter__(self) -> None:
        self.gate.users += 1
        try:
            await self.gate.slots.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.gate.slots.release()
        self._leave()

    def _leave(self) -> None:
        self.gate.users -= 1
        if self.gate.users == 0 and _gates.get(self.where) is self.gate:
            del _gates[self.where]


def branch_slot(task_id: str, key: str, limit: int) -> AbstractAsyncContextManager[None]:
    """Hold one of the ``limit`` slots of the fan-out ``key`` of ``task_id`` (waits, first
    come first served, while all are taken). Cancelling a waiter takes no slot."""
    return _Slot(task_id, key, limit)


def window_size(max_concurrency: int | None, total: int) -> int:
    """The cluster-wide window of a visit of ``total`` branches: the fan-out's own
    ``max_concurrency``, or all of them when it sets none (each node's pool bounds those)."""
    return max_concurrency or total


def window_end(total: int, limit: int, settled: int) -> int:
    """How many of a visit's branches, in order, have been started when ``settled`` of them
    are settled: the first ``limit``, and one more for each settled."""
    return min(total, limit + settled)


def started(names: list[str], statuses: Mapping[str, str], limit: int) -> list[str]:
    """Of ``names`` (in order), those started and still RUNNING per ``statuses`` (a branch
    without a status is RUNNING)."""
    settled = sum(1 for b in names if statuses.get(b, "RUNNING") != "RUNNING")
    end = window_end(len(names), limit, settled)
    return [b for b in names[:end] if statuses.get(b, "RUNNING") == "RUNNING"]


def branch_order(names: Iterable[str], mapped: bool) -> list[str]:
    """A visit's branches in the order they start: a map's by item index (``"0"``,
    ``"1"``, …), a fan-out's as ``names`` gives them (its declaration's)."""
    return sorted(names, key=int) if mapped else list(names)


def started_in_window(node: Any, rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Of a fan-out or map ``node``'s visit whose branch rows are ``rows``, the branches
    started and still RUNNING; every RUNNING one for another node kind."""
    statuses = {b: str(r.get("status", "RUNNING")) for b, r in rows.items()}
    if not isinstance(node, MapNode | FanoutNode):
        return [b for b, s in statuses.items() if s == "RUNNING"]
    order = branch_order(rows, True) if isinstance(node, MapNode) else list(node.branches)
    return started(order, statuses, window_size(node.max_concurrency, len(order)))


def branch_timer_id(task_id: str, key: str, branch: str) -> str:
    return f"br:{task_id}:{key}:{branch}"


def branch_timer(task_id: str, key: str, node: str, branch: str, due_at: float) -> TimerWrite:
    """The durable timer that times a branch out (``on_timer`` settles it TIMED_OUT)."""
    return TimerWrite(branch_timer_id(task_id, key, branch), "branch_timeout", due_at,
                      {"key": key, "node": node, "branch": branch})


@dataclass(frozen=True, slots=True)
class BranchDone:
    """A ``branch.done`` mail (from the node that ran these branches, an earlier release's,
    or forged): a nudge, checked against the rows before anything counts."""

    statuses: dict[str, str]


@dataclass(frozen=True, slots=True)
class BranchesDone:
    """From the fan-out's settler, in process: these settlements are committed, with
    these results (as the store holds them)."""

    statuses: dict[str, str]
    results: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WindowMoved:
    """From a fan-out's join to its task: ``settled`` of the visit's branches are settled,
    so the next ones may start (actors/task/branch_window.py)."""

    key: str
    settled: int


@dataclass(frozen=True, slots=True)
class JoinTimeout:
    pass


@dataclass(frozen=True, slots=True)
class ResendVerdict:
    """From a restarted task actor: repeat the verdict if it was already reached."""


@dataclass(frozen=True, slots=True)
class Recount:
    """Read the completion set from the store again (the recovery sweeper's nudge: a
    ``branch.done`` mail can be lost, the branch's row cannot)."""


@dataclass(frozen=True, slots=True)
class JoinDone:
    key: str
    node: str
    verdict: JoinVerdict
    results: dict[str, Any]


_EVENT_OF = {"SUCCEEDED": EventType.BRANCH_COMPLETED, "FAILED": EventType.BRANCH_FAILED,
             "TIMED_OUT": EventType.BRANCH_TIMED_OUT}


def branch_settlement(node: str, branch: str, status: str, payload: dict[str, Any],
                      result: Any = None, error: dict[str, Any] | None = None
                      ) -> BranchSettlement:
    """A branch's settlement: its row's status, result and error, and its event
    (``branch.completed``, ``branch.failed`` or ``branch.timed_out``)."""
    return BranchSettlement(branch, status, result, error,
                            (_EVENT_OF[status], {"node": node, "branch": branch, **payload}))


class JoinActor(Actor):
    """Keeps a fan-out's completion set and tells the task when the policy has decided."""

    def __init__(self, *, task_id: str, key: str, node: str, policy: JoinPolicy,
                 branches: list[str], store: TaskStore, tell_task: Any,
                 timer_fired: bool, rows: dict[str, Any] | None = None,
                 window: int = 0) -> None:
        """``rows``: the fan-out's branch rows as its starter just read or wrote them (saves
        reading them at start); None: read them. ``window``: the fan-out's
        ``max_concurrency`` when the task starts the branches as others settle (it has
        more branches): tell it the settled count (0: never)."""
        self.task_id, self.key, self.node, self.policy = task_id, key, node, policy
        # By name, not by ref: the task actor may be restarted while the branches run.
        self.branches, self.store, self.tell_task = branches, store, tell_task
        self.timed_out = timer_fired
        self.statuses: dict[str, str] = {}
        self.counts: Counter[str] = Counter()  # branches per status, kept with ``statuses``
        self.results: dict[str, Any] = {}  # of SUCCEEDED branches: read, or told with them
        self.verdict: JoinDone | None = None
        self.rows = rows
        #: Told in steps of an eighth of the window: each move costs the task a turn and a
        #: mail per partition, and a window that is 7/8 full at worst runs as well.
        self.step = max(1, window // 8)
        self.window, self.told = window, -1  # the settled count the task was last told

    async def on_start(self) -> None:
        if self.rows is None:
            await self._evaluate(await self._recount())
        else:
            rows, self.rows = self.rows, None
            self._adopt(rows)
            await self._evaluate(rows)

    async def receive(self, message: Any) -> Any:
        if isinstance(message, BranchesDone):
            # Committed settlements, told in process: counted as told; the store is read
            # once, when the counts say the policy may decide (``_evaluate``).
            for branch, status in message.statuses.items():
                if self.statuses.get(branch) == "RUNNING":
                    self.statuses[branch] = status
                    self.counts.update({"RUNNING": -1, status: 1})
                    if status == "SUCCEEDED" and branch in message.results:
                        self.results[branch] = message.results[branch]
            await self._evaluate()
        elif isinstance(message, BranchDone):
            # The message is a nudge; the rows are the truth, read once for all it names. A
            # repeat, a late or a forged notification cannot settle a branch the store does
            # not hold as settled.
            named = [b for b in message.statuses if self.statuses.get(b) == "RUNNING"]
            # Only the rows named (a wide fan-out's notices come in many small groups).
            rows = await self.store.branches_named(self.task_id, self.key, named) \
                if named else {}
            for branch, row in rows.items():
                if row["status"] != "RUNNING":
                    self.statuses[branch] = row["status"]
                    self.counts.update({"RUNNING": -1, row["status"]: 1})
                    if row["status"] == "SUCCEEDED":
                        self.results[branch] = row.get("result")
            await self._evaluate()
        elif isinstance(message, JoinTimeout):
            # Decide on the store's view, not on notifications still in flight: a branch
            # that finished before the deadline must not count as late.
            rows = await self._recount()
            self.timed_out = True
            await self._evaluate(rows)
        elif isinstance(message, Recount):
            await self._evaluate(await self._recount())
        elif isinstance(message, ResendVerdict):
            if self.verdict is not None:
                self.tell_task(self.task_id, self.verdict)
        else:
            return await super().receive(message)
        return None

    async def _recount(self) -> dict[str, dict[str, Any]]:
        """Read the completion set from the store; returns the rows it was read from."""
        rows = await self.store.branches(self.task_id, self.key)
        self._adopt(rows)
        return rows

    def _adopt(self, rows: dict[str, dict[str, Any]]) -> None:
        self.statuses = {b: rows.get(b, {}).get("status", "RUNNING") for b in self.branches}
        self.counts = Counter(self.statuses.values())
        self.results = {b: r.get("result") for b, r in rows.items()
                        if r.get("status") == "SUCCEEDED"}

    async def _evaluate(self, rows: dict[str, dict[str, Any]] | None = None) -> None:
        """Decide once; ``rows``: the branch rows just read, if any. The counts say first
        whether the policy may decide (no run over every branch while it waits: a wide
        map); the decision then takes the statuses and results the join holds — read from
        the store, or told by the settler with what it committed — and reads the rows
        only when it holds a SUCCEEDED branch without its result."""
        if self.window and self.verdict is None:
            settled = len(self.branches) - self.counts["RUNNING"]
            # Never more than the window's size behind: the branches in flight then are
            # at least ``window - step``, and their settlements tell again.
            if settled >= self.told + self.step or (self.told < 0 and settled > self.told):
                self.told = settled
                self.tell_task(self.task_id, WindowMoved(self.key, settled))
        if self.verdict is not None or not may_decide(self.policy, self.counts, self.timed_out):
            return
        if rows is None and any(s == "SUCCEEDED" and b not in self.results
                                for b, s in self.statuses.items()):
            self._adopt(await self.store.branches(self.task_id, self.key))
        verdict = decide(self.policy, self.statuses, self.timed_out)
        if verdict is None:
            return
        results = {b: self.results.get(b) for b, s in self.statuses.items() if s == "SUCCEEDED"}
        self.verdict = JoinDone(self.key, self.node, verdict, results)
        self.tell_task(self.task_id, self.verdict)
