"""The node kinds of a workflow graph, and what step code sees.

Every node names its successors up front, so a workflow can be listed, validated, drawn
and audited before it runs: the runtime moves a task only along declared edges.

========================  ==============================================================
kind                      successors
========================  ==============================================================
step                      ``next`` (default: the next node declared, or the end); its
                          ``on_exhausted`` is ``"fail"`` or ``"human"``, not a node
choice (conditional)      ``targets``: the guard must return one of them
route (routing table)     ``table`` values and the required ``default``
fanout                    its ``join`` (branches run between them)
join                      ``next``
approval (suspension)     ``on_approve``, ``on_reject``, and ``on_timeout`` (a node, or
                          ``"cancel"``)
wait (suspension)         ``next``, and ``on_timeout`` (a node, or ``"fail"``)
agent                     ``next``; ``on_budget_exhausted`` and ``on_loop`` (a node, or
                          ``"fail"``)
map (fan-out over list)   ``next`` (``actors/workflow/map_node.py``)
loop                      itself, ``next``, and ``on_exhausted`` (a node, or ``"fail"``;
                          ``actors/workflow/loop_node.py``)
========================  ==============================================================
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Protocol

from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import WorkflowDefinitionError

__all__ = [
    "BranchGraph",
    "DEFAULT_STEP_TIMEOUT",
    "WORKFLOW_DEFAULT",
    "END",
    "CANCEL",
    "FAIL",
    "HUMAN",
    "AgentNode",
    "ApprovalNode",
    "ChoiceNode",
    "FanoutNode",
    "JoinNode",
    "JoinPolicy",
    "Node",
    "RouteNode",
    "StepContext",
    "StepFn",
    "StepNode",
    "StepTimeout",
    "WaitNode",
]

#: Successor that finishes the workflow (the task SUCCEEDS).
END = "END"
#: ``on_timeout`` of an approval that cancels the task.
CANCEL = "cancel"
#: ``on_timeout`` of a wait that fails the task.
FAIL = "fail"
#: ``on_exhausted`` of a step or an agent that hands the task to a human instead of failing.
HUMAN = "human"
#: Why ``ctx.sleep`` refuses inside a fan-out branch (a branch runs in its task's actor and
#: cannot passivate on its own): a sleep node, or a step's ``ctx.sleep``, instead.
SLEEP_IN_BRANCH = ("ctx.sleep is not available inside a fan-out branch: sleep in a step of"
                   " the task, or declare a sleep node, wf.sleep(name, seconds=...); for a short"
                   " in-memory pause use await ctx.clock.sleep(seconds)")

#: Seconds a step may run when neither it nor its workflow says otherwise
#: (``Workflow(step_timeout=...)``, ``@wf.step(timeout=...)``; None: no bound, only when
#: asked for). A step that never returns must not hold its task RUNNING for ever.
DEFAULT_STEP_TIMEOUT = 600.0


class _WorkflowDefault(Enum):
    WORKFLOW_DEFAULT = "the workflow's step_timeout"


#: A step's ``timeout`` not given (its workflow's ``step_timeout`` applies), as distinct
#: from ``timeout=None`` (no bound, asked for).
WORKFLOW_DEFAULT = _WorkflowDefault.WORKFLOW_DEFAULT
StepTimeout = float | None | Literal[_WorkflowDefault.WORKFLOW_DEFAULT]



class BranchGraph(Protocol):
    """A fan-out branch's graph as the nodes see it (``actors/workflow/graph.py``'s ``Workflow``
    implements it; named here so that the node kinds need not import the graph)."""

    @property
    def name(self) -> str: ...

    @property
    def start(self) -> str: ...

    def node(self, name: str) -> Node: ...

    def validate(self, *, as_branch: bool = False) -> None: ...


@dataclass(slots=True)
class StepContext:
    task_id: str
    tenant: str
    workflow: str
    step_name: str
    step_index: int
    attempt: int
    input: Mapping[str, Any]
    state: dict[str, Any]
    clock: Clock
    log: Any  # a structlog BoundLogger with task_id and step bound
    runner: Any = None  # the task's ActionRunner (set by the task actor)
    branch: str | None = None  # set inside a fan-out branch
    iteration: int | None = None  # a loop's iteration, from 0 (actors/workflow/loop_node.py)
    sleeper: Any = None  # actors.task.step_sleep.StepSleeper (None inside a branch)
    beat: Any = None  # actors.task.heartbeat.StepHeartbeat (None: heartbeats are ignored)
    _random: random.Random | None = field(default=None, repr=False)

    @property
    def random(self) -> random.Random:
        """Random numbers for this step run, seeded by where it runs (the task, its step
        index, the branch and the loop iteration): a step that runs again — after a crash,
        or in a replay (``ratchet replay``) — draws the same numbers. Use it (and
        :meth:`uuid`) rather than ``random`` or ``uuid4`` for anything the step decides
        or names: those differ on each run, so a replay reports them as divergences."""
        if self._random is None:
            where = f"{self.task_id}:{self.step_index}:{self.branch or ''}:{self.iteration}"
            seed = int.from_bytes(hashlib.sha256(where.encode()).digest()[:16], "big")
            self._random = random.Random(seed)
        return self._random

    def uuid(self) -> uuid.UUID:
        """A version-4 UUID from :attr:`random`: the same on a re-run or a replay."""
        return uuid.UUID(int=self.random.getrandbits(128), version=4)

    async def call(self, tool: Tool[Any, Any], args: Any) -> Any:
        """Call a registered tool under the action protocol and return its result model.

        Writes take effect once (ledger + idempotency key); a completed call is never made
        again when the step re-runs, its recorded result is returned instead.
        """
        return await self.runner.call(tool, args)

    async def heartbeat(self, progress: float | tuple[float, float] | None = None,
                        note: str | None = None) -> None:
        """Say how far this step is — a fraction from 0 to 1, or ``(done, total)`` — with
        an optional note, without a checkpoint (``admin diagnose`` and ``admin get`` show
        it; actors/task/heartbeat.py). At most one is written a second."""
        if self.beat is not None:
            await self.beat.beat(self.step_name, self.attempt, progress, note)

    async def sleep(self, seconds: float) -> None:
        """Sleep durably: the task passivates (SLEEPING, a timer row) and, when the time
        has come, the step runs again from its top, its completed calls and sleeps answered
        at once (actors/task/step_sleep.py).

        Raises:
            WorkflowDefinitionError: inside a fan-out branch (no sleeper).
        """
        if self.sleeper is None:
            raise WorkflowDefinitionError(SLEEP_IN_BRANCH, step=self.step_name, seconds=seconds)
        await self.sleeper.sleep(seconds)


StepFn = Callable[[StepContext], Awaitable[Mapping[str, Any] | None]]
Guard = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class Node:
    name: str
    #: How often the task may enter this node; required on every node of a cycle.
    max_visits: int | None = field(default=None, kw_only=True)

    kind = "node"

    def successors(self) -> list[str]:
        raise NotImplementedError

    @property
    def counts_visits(self) -> bool:
        """Whether leaving the node counts a visit (``tasks.visits``): only where the count
        is read — a loop bound, the per-visit keys of fan-outs, joins, waits, approvals and
        agents (a 1,000-step sequence must not rewrite a 1,000-entry map at every step)."""
        return self.max_visits is not None or self.kind in ("fanout", "join", "wait",
                                                            "approval", "agent")


def _check_on_exhausted(node: Node, value: str) -> None:
    if value not in (FAIL, HUMAN):  # docs/workflows.md, "Handing a node over to a human"
        raise WorkflowDefinitionError(f"{node.kind} {node.name!r}: on_exhausted must be"
                                      f" {FAIL!r} or {HUMAN!r}, not {value!r}")


@dataclass(frozen=True)
class StepNode(Node):
    fn: StepFn
    next: str = END
    timeout: float | None = None
    #: ``wf.step(on_exhausted=...)``: when its last allowed attempt failed, ``"fail"`` the
    #: task (compensating) or ``"human"``: WAITING_APPROVAL with a handoff
    #: (actors/task/exhausted.py). Not named ``on_exhausted``: a loop node's is a node.
    attempts_exhausted: str = field(default=FAIL, kw_only=True)
    #: A human may skip it at a handoff (``admin skip-step``): it moves on to ``next``.
    skippable: bool = field(default=False, kw_only=True)
    kind = "step"

    def __post_init__(self) -> None:
        _check_on_exhausted(self, self.attempts_exhausted)

    def successors(self) -> list[str]:
        return [self.next]


@dataclass(frozen=True)
class ChoiceNode(Node):
    guard: Guard
    targets: tuple[str, ...]
    kind = "choice"

    def successors(self) -> list[str]:
        return list(self.targets)


@dataclass(frozen=True)
class RouteNode(Node):
    key: Callable[[Mapping[str, Any]], Any]
    table: Mapping[Any, str]
    default: str | None
    kind = "route"

    def successors(self) -> list[str]:
        out = list(dict.fromkeys(self.table.values()))
        if self.default is not None and self.default not in out:
            out.append(self.default)
        return out


@dataclass(frozen=True)
class JoinPolicy:
    """How a join decides.

    - ``all``: every branch must succeed;
    - ``at_least``: ``k`` successes are enough (the join completes as soon as k succeeded);
    - ``required``: the ``required`` branches must succeed, the others are optional.
    ``timeout`` (seconds after the fan-out started): the join decides with what it has;
    branches still running count as timed out. ``defaults``: the value a missing, failed
    or timed-out branch takes instead of failing the join (degrade).
    """

    mode: Literal["all", "at_least", "required"] = "all"
    k: int | None = None
    required: frozenset[str] = frozenset()
    timeout: float | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FanoutNode(Node):
    branches: Mapping[str, BranchGraph]
    join: str
    #: Each branch's own time budget (seconds); a branch past it is TIMED_OUT.
    branch_timeout: float | None = None
    #: ``branch_input(state, branch) -> dict``: the branch's initial state.
    branch_input: Callable[[Mapping[str, Any], str], dict[str, Any]] | None = None
    #: At most this many branches of one task run their body at once (the others wait
    #: their turn); None: ``actors.task.fanout.DEFAULT_BRANCH_CONCURRENCY``.
    max_concurrency: int | None = None
    #: A branch whose body raises runs again, from its last committed step, this many times.
    branch_retries: int = 0
    kind = "fanout"

    def successors(self) -> list[str]:
        return [self.join]


@dataclass(frozen=True)
class JoinNode(Node):
    of: str
    policy: JoinPolicy
    next: str = END
    kind = "join"

    def successors(self) -> list[str]:
        return [self.next]


@dataclass(frozen=True)
class ApprovalNode(Node):
    on_approve: str
    on_reject: str
    timeout: float | None
    on_timeout: str | None
    approvers: str = "approvers"
    #: ``request(state) -> dict``: exactly what is being approved (amount, resource, ...).
    request: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    kind = "approval"

    def successors(self) -> list[str]:
        out = [self.on_approve, self.on_reject]
        if self.on_timeout not in (None, CANCEL):
            out.append(self.on_timeout)
        return list(dict.fromkeys(out))


@dataclass(frozen=True)
class AgentNode(Node):
    """A model proposes the next action; the runtime validates it against ``tools`` and their
    argument schemas, checks the budget and the loop detectors, executes it through the tool
    sessions (writes go through the ledger), records it, and loops until a final answer
    that validates against ``output``.

    ``model``: a Model, or the name of a registry resource holding one.
    ``prompt(state, input) -> str``: the first user message.
    """

    model: Any
    tools: tuple[Tool[Any, Any], ...]
    output: type[Any]
    prompt: Callable[[Mapping[str, Any], Mapping[str, Any]], str]
    system: str = ""
    max_turns: int = 20
    repair_attempts: int = 2
    loop: Any = None  # actors.agents.loop_detect.LoopPolicy (None: the defaults)
    params: Mapping[str, Any] = field(default_factory=dict)
    model_timeout: float = 60.0
    next: str = END
    on_budget_exhausted: str = FAIL
    on_loop: str = FAIL
    on_exhausted: str = FAIL  # "human": an answer still invalid after its repairs goes to one
    degrade: Any = None  # actors.agents.degrade.Degradation (None: the model alone)
    compact: Any = None  # actors.agents.compaction.Compaction (None: never compacted)
    kind = "agent"

    def __post_init__(self) -> None:
        _check_on_exhausted(self, self.on_exhausted)

    def successors(self) -> list[str]:
        out = [self.next]
        out += [t for t in (self.on_budget_exhausted, self.on_loop,
                            getattr(self.degrade, "on_exhausted", FAIL)) if t != FAIL]
        return list(dict.fromkeys(out))


@dataclass(frozen=True)
class WaitNode(Node):
    correlation: Callable[[Mapping[str, Any]], str]
    timeout: float | None
    on_timeout: str | None
    next: str = END
    kind = "wait"

    def successors(self) -> list[str]:
        out = [self.next]
        if self.on_timeout not in (None, FAIL):
            out.append(self.on_timeout)
        return list(dict.fromkeys(out))
