"""Workflows as explicit graphs: built in Python, validated at registration, exported as a
transition table and a Mermaid diagram.

    wf = Workflow("expense.approve", version=1)

    @wf.step                                   # sequence: next declared node by default
    async def assess(ctx): ...

    wf.choice("size", guard=lambda s: "auto" if s["amount"] < 100 else "manager",
              targets=["auto", "manager"])     # conditional edge
    wf.approval("manager", on_approve="pay", on_reject=END, timeout=86400,
                on_timeout="director")         # suspension with escalation

A guard returning an undeclared target is an error at run time, never a jump.
``Workflow(..., input_model=Model)`` declares the input a task is submitted with: intake
validates it (a bad submission is refused up front) and a ``SecretStr`` field of it is a
secret — sealed at rest, redacted wherever shown (docs/security-secrets.md).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from ratchet.actors.workflow.cycles import cycles
from ratchet.actors.workflow.edges import node_edges
from ratchet.actors.workflow.loop_node import LoopBuilder, LoopNode, check_loop
from ratchet.actors.workflow.map_node import MapBuilder, MapNode, check_map, check_retries
from ratchet.actors.workflow.migrations import MigrationBuilder
from ratchet.actors.workflow.node_loops import NodeLoops, check_node_loops
from ratchet.actors.workflow.nodes import (
    CANCEL,
    DEFAULT_STEP_TIMEOUT,
    END,
    FAIL,
    WORKFLOW_DEFAULT,
    AgentNode,
    ApprovalNode,
    ChoiceNode,
    FanoutNode,
    JoinNode,
    JoinPolicy,
    Node,
    RouteNode,
    StepFn,
    StepNode,
    StepTimeout,
    WaitNode,
)
from ratchet.actors.workflow.reconcile import Reconcile
from ratchet.actors.workflow.revalidate import RevalidateBuilder
from ratchet.actors.workflow.sleep import sleep_node
from ratchet.protocol.errors import InvalidMessage, WorkflowDefinitionError
from ratchet.protocol.redaction import dump_model, has_secrets

__all__ = ["Workflow"]

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_BRANCH = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_BRANCH_KINDS = ("step", "choice", "route")


class Workflow(MapBuilder, LoopBuilder, RevalidateBuilder, MigrationBuilder):
    """A named, versioned graph of nodes; the first node declared is where a task starts.

    Its ``map``, ``loop`` and ``migrate_from`` builders live in their own modules
    (``map_node.py``, ``loop_node.py``, ``migrations.py``)."""

    def __init__(self, name: str, version: int = 1, description: str = "", *,
                 compensate_on_cancel: bool = False,
                 input_model: type[BaseModel] | None = None,
                 step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
                 loops: NodeLoops | None = None, reconcile: Reconcile | None = None,
                 compatible_with: Iterable[str] = ()) -> None:
        if not _NAME.match(name):
            raise WorkflowDefinitionError(f"workflow name {name!r} must match {_NAME.pattern}")
        if not isinstance(version, int) or version < 1:
            raise WorkflowDefinitionError(f"workflow {name}: version must be an int >= 1")
        if step_timeout is not None and step_timeout <= 0:
            raise WorkflowDefinitionError(f"workflow {name}: step_timeout must be > 0 or None")
        #: The timeout of its steps that do not give one (None: unbounded).
        self.step_timeout = step_timeout
        self.name = name
        self.version = version
        self.description = description
        #: Run the saga (undo completed side effects) when an operator cancels the task.
        self.compensate_on_cancel = compensate_on_cancel
        #: Earlier definition hashes of this version its tasks may go on under (definition.py).
        self.compatible_with = frozenset(compatible_with)
        if input_model is not None and not (isinstance(input_model, type)
                                            and issubclass(input_model, BaseModel)):
            raise WorkflowDefinitionError(
                f"workflow {name}: input_model must be a pydantic model class")
        #: What a task's input must validate as (None: any map, taken as it is).
        self.input_model = input_model
        #: Whether that input declares secrets (``SecretStr`` fields, at any depth).
        self.has_secret_input = input_model is not None and has_secrets(input_model)
        self.nodes: dict[str, Node] = {}
        self._implicit_next: set[str] = set()
        #: Node loop detection (node_loops.py) and the nodes it watches (set by validate).
        self.loops, self.looping_nodes = loops or NodeLoops(), frozenset[str]()
        self.reconcile = reconcile  #: the drift reconciliation job (reconcile.py), if any

    # -- building ----------------------------------------------------------------------

    def _add(self, node: Node, implicit_next: bool = False) -> Node:
        where = f"workflow {self.name}"
        if not _NAME.match(node.name) or node.name == END:
            raise WorkflowDefinitionError(f"{where}: node name {node.name!r} is invalid")
        if node.name in self.nodes:
            raise WorkflowDefinitionError(f"{where}: duplicate node {node.name!r}")
        if node.max_visits is not None and node.max_visits < 1:
            raise WorkflowDefinitionError(f"{where}: node {node.name!r} max_visits must be >= 1")
        self.nodes[node.name] = node
        if implicit_next:
            self._implicit_next.add(node.name)
        return node

    def step(self, fn: StepFn | None = None, *, name: str | None = None, next: str | None = None,
             timeout: StepTimeout = WORKFLOW_DEFAULT, max_visits: int | None = None,
             on_exhausted: str = FAIL, skippable: bool = False) -> Any:
        """Decorator adding a step node: ``@wf.step`` or ``@wf.step(next=..., timeout=...)``
        (seconds; not given: the workflow's ``step_timeout``; None: no bound)."""

        def add(f: StepFn) -> StepFn:
            self.add_step(name or f.__name__, f, next=next, timeout=timeout, max_visits=max_visits,
                          on_exhausted=on_exhausted, skippable=skippable)
            return f

        return add(fn) if fn is not None else add

    def add_step(self, name: str, fn: StepFn, *, next: str | None = None,
                 timeout: StepTimeout = WORKFLOW_DEFAULT, max_visits: int | None = None,
                 on_exhausted: str = FAIL, skippable: bool = False) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise WorkflowDefinitionError(
                f"workflow {self.name}: step {name!r} must be an async function")
        if timeout is WORKFLOW_DEFAULT:
            timeout = self.step_timeout
        if timeout is not None and timeout <= 0:
            raise WorkflowDefinitionError(f"workflow {self.name}: step {name!r} timeout must be > 0")
        self._add(StepNode(name, fn, next or END, timeout, attempts_exhausted=on_exhausted,
                           skippable=skippable, max_visits=max_visits),
                  implicit_next=next is None)

    def choice(self, name: str, guard: Callable[[Mapping[str, Any]], str],
               targets: Iterable[str], *, max_visits: int | None = None) -> None:
        """Conditional edge: ``guard(state)`` picks one of ``targets``."""
        self._add(ChoiceNode(name, guard, tuple(targets), max_visits=max_visits))

    def route(self, name: str, key: Callable[[Mapping[str, Any]], Any], table: Mapping[Any, str],
              default: str | None = None, *, max_visits: int | None = None) -> None:
        """Routing table: ``key(state)`` looked up in ``table``, else ``default`` (required)."""
        self._add(RouteNode(name, key, dict(table), default, max_visits=max_visits))

    def fanout(self, name: str, branches: Mapping[str, Workflow], join: str, *,
               branch_timeout: float | None = None,
               branch_input: Callable[[Mapping[str, Any], str], dict[str, Any]] | None = None,
               max_concurrency: int | None = None, max_visits: int | None = None,
               branch_retries: int = 0) -> None:
        """Run one branch per graph (each a small graph of steps/choices/routes). At most
        ``max_concurrency`` of the task's branches run at once, the others wait their turn
        (None: ``actors.task.fanout.DEFAULT_BRANCH_CONCURRENCY``); ``branch_timeout`` counts
        from when a branch starts running; a branch that raises runs again, from its last
        committed step, ``branch_retries`` times."""
        self._add(FanoutNode(name, dict(branches), join, branch_timeout, branch_input,
                             max_concurrency, branch_retries, max_visits=max_visits))

    def join(self, name: str, of: str, policy: JoinPolicy | None = None, next: str | None = None,
             *, max_visits: int | None = None) -> None:
        """Fan-in of the fan-out ``of``; the branches' results land in ``state[name]``."""
        self._add(JoinNode(name, of, policy or JoinPolicy(), next or END, max_visits=max_visits),
                  implicit_next=next is None)

    def approval(self, name: str, *, on_approve: str, on_reject: str, timeout: float | None,
                 on_timeout: str | None, approvers: str = "approvers",
                 request: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
                 max_visits: int | None = None) -> None:
        """Suspend in WAITING_APPROVAL until a decision; ``on_timeout``: a node or "cancel"."""
        self._add(ApprovalNode(name, on_approve, on_reject, timeout, on_timeout, approvers,
                               request, max_visits=max_visits))

    def wait(self, name: str, *, correlation: Callable[[Mapping[str, Any]], str],
             timeout: float | None, on_timeout: str | None, next: str | None = None,
             max_visits: int | None = None) -> None:
        """Suspend in WAITING_EXTERNAL until a message with ``correlation(state)`` arrives
        on ``ratchet.external.<tenant>``; ``on_timeout``: a node or "fail"."""
        self._add(WaitNode(name, correlation, timeout, on_timeout, next or END,
                           max_visits=max_visits), implicit_next=next is None)

    def sleep(self, name: str, *, seconds: float | None = None,
              until: Callable[[Mapping[str, Any]], float] | None = None, next: str | None = None,
              max_visits: int | None = None) -> None:
        """A durable sleep (actors/workflow/sleep.py): park SLEEPING, then go on to ``next``."""
        self._add(sleep_node(name, seconds, until, next or END, max_visits),
                  implicit_next=next is None)

    def agent(self, name: str, *, model: Any, tools: Iterable[Any], output: type[Any],
              prompt: Callable[[Mapping[str, Any], Mapping[str, Any]], str], system: str = "",
              max_turns: int = 20, repair_attempts: int = 2, loop: Any = None,
              params: Mapping[str, Any] | None = None, model_timeout: float = 60.0,
              next: str | None = None, on_budget_exhausted: str = FAIL, on_loop: str = FAIL,
              max_visits: int | None = None, degrade: Any = None, compact: Any = None,
              on_exhausted: str = FAIL) -> None:
        """An agent node: the model proposes tool calls or an answer; the runtime disposes.
        ``degrade``: a ``Degradation`` (fallback models, answer cache, a node when all
        fail); ``compact``: a ``Compaction`` (summarize a long conversation; docs/agents.md)."""
        self._add(AgentNode(name, model, tuple(tools), output, prompt, system, max_turns,
                            repair_attempts, loop, dict(params or {}), model_timeout,
                            next or END, on_budget_exhausted, on_loop, on_exhausted,
                            degrade, compact, max_visits=max_visits),
                  implicit_next=next is None)

    def parse_input(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """A submitted input as a task keeps it: validated as ``input_model`` and dumped as
        plain data whose secret fields stay ``SecretStr`` (``ctx.input["api_key"]``); the
        map as it is without a model.

        Raises:
            InvalidMessage: the input does not validate (its values are not quoted).
        """
        if self.input_model is None:
            return dict(raw)
        try:
            model = self.input_model.model_validate(raw)
        except ValidationError as exc:
            problems = [{"field": ".".join(str(p) for p in err["loc"]), "problem": err["msg"]}
                        for err in exc.errors()[:10]]
            raise InvalidMessage(f"input of workflow {self.name} failed validation",
                                 problems=problems) from None
        data: dict[str, Any] = dump_model(model)
        return data

    # -- reading -------------------------------------------------------------------------

    @property
    def start(self) -> str:
        return next(iter(self.nodes))

    def node(self, name: str) -> Node:
        return self.nodes[name]

    @property
    def step_count(self) -> int:
        """Step nodes, and a counted loop's iterations (an ``until`` loop counts one)."""
        return sum(n.max_iterations if isinstance(n, LoopNode) and n.until is None else 1
                   for n in self.nodes.values() if n.kind in ("step", "loop"))

    # -- validation ------------------------------------------------------------------------

    def validate(self, *, as_branch: bool = False) -> None:
        """Check the graph; raises WorkflowDefinitionError naming the bad node."""
        where = f"workflow {self.name}"
        if not self.nodes:
            raise WorkflowDefinitionError(f"{where}: has no nodes")
        self._resolve_implicit_next()
        for node in self.nodes.values():
            self._check_node(node, where, as_branch)
        self._check_revalidate(where)  # actors/workflow/revalidate.py
        self._check_reachable(where)
        self._check_cycles(where, found := cycles(self.nodes))  # found once, used twice
        self.looping_nodes = check_node_loops(self.loops, self.nodes, where, found)

    def _resolve_implicit_next(self) -> None:
        names = list(self.nodes)
        for i, name in enumerate(names):
            if name in self._implicit_next:
                following = names[i + 1] if i + 1 < len(names) else END
                self.nodes[name] = dataclasses.replace(  # type: ignore[call-arg]
                    self.nodes[name], next=following)

    def _check_node(self, node: Node, where: str, as_branch: bool) -> None:
        here = f"{where}: node {node.name!r} ({node.kind})"
        if as_branch and node.kind not in _BRANCH_KINDS:
            raise WorkflowDefinitionError(f"{here}: a branch may hold only steps, choices, routes")
        for target in node.successors():
            if target != END and target not in self.nodes:
                raise WorkflowDefinitionError(f"{here}: unknown target {target!r}")
        if isinstance(node, ChoiceNode) and not node.targets:
            raise WorkflowDefinitionError(f"{here}: a choice needs at least one target")
        if isinstance(node, RouteNode) and node.default is None:
            raise WorkflowDefinitionError(f"{here}: a routing table needs a default")
        if isinstance(node, ApprovalNode | WaitNode):
            if node.timeout is None or node.on_timeout is None:
                raise WorkflowDefinitionError(f"{here}: a suspension needs a timeout and on_timeout")
            if node.timeout <= 0:
                raise WorkflowDefinitionError(f"{here}: timeout must be > 0")
        if isinstance(node, WaitNode) and node.on_timeout not in (FAIL, *self.nodes):
            raise WorkflowDefinitionError(f"{here}: on_timeout must be a node or {FAIL!r}")
        if isinstance(node, ApprovalNode) and node.on_timeout not in (CANCEL, *self.nodes):
            raise WorkflowDefinitionError(f"{here}: on_timeout must be a node or {CANCEL!r}")
        if isinstance(node, AgentNode):
            self._check_agent(node, here)
        if isinstance(node, FanoutNode):
            self._check_fanout(node, here)
        if isinstance(node, JoinNode):
            self._check_join(node, here)
        if isinstance(node, MapNode):
            check_map(node, here)
        if isinstance(node, LoopNode):
            check_loop(node, here)

    def _check_fanout(self, node: FanoutNode, here: str) -> None:
        if not node.branches:
            raise WorkflowDefinitionError(f"{here}: a fan-out needs at least one branch")
        limit = node.max_concurrency
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 1):
            raise WorkflowDefinitionError(
                f"{here}: max_concurrency must be an int >= 1, got {limit!r}")
        check_retries(node.branch_retries, "branch_retries", here)
        join = self.nodes.get(node.join)
        if not isinstance(join, JoinNode) or join.of != node.name:
            raise WorkflowDefinitionError(f"{here}: its join {node.join!r} must be a join of it")
        for branch, graph in node.branches.items():
            if not _BRANCH.match(branch):
                raise WorkflowDefinitionError(f"{here}: branch name {branch!r} is invalid")
            graph.validate(as_branch=True)

    def _check_agent(self, node: AgentNode, here: str) -> None:
        if not node.tools:
            raise WorkflowDefinitionError(f"{here}: an agent needs at least one tool")
        names = [t.name for t in node.tools]
        if len(names) != len(set(names)):
            raise WorkflowDefinitionError(f"{here}: duplicate tool names {names}")
        if not (isinstance(node.output, type) and issubclass(node.output, BaseModel)):
            raise WorkflowDefinitionError(f"{here}: output must be a pydantic model class")
        if node.max_turns < 1 or node.repair_attempts < 0:
            raise WorkflowDefinitionError(f"{here}: max_turns >= 1 and repair_attempts >= 0")

    def _check_join(self, node: JoinNode, here: str) -> None:
        fanout = self.nodes.get(node.of)
        if not isinstance(fanout, FanoutNode) or fanout.join != node.name:
            raise WorkflowDefinitionError(f"{here}: a join without its fan-out ({node.of!r})")
        for other in self.nodes.values():
            if other is not fanout and node.name in other.successors():
                raise WorkflowDefinitionError(
                    f"{here}: only its fan-out may lead to it, not {other.name!r}")
        branches = set(fanout.branches)
        policy = node.policy
        unknown = (set(policy.required) | set(policy.defaults)) - branches
        if unknown:
            raise WorkflowDefinitionError(f"{here}: policy names unknown branches {sorted(unknown)}")
        if policy.mode == "at_least" and not (policy.k and 1 <= policy.k <= len(branches)):
            raise WorkflowDefinitionError(f"{here}: at_least needs 1 <= k <= {len(branches)}")
        if policy.mode == "required" and not policy.required:
            raise WorkflowDefinitionError(f"{here}: mode 'required' needs required branches")

    def _check_reachable(self, where: str) -> None:
        seen, frontier = set(self._roots), list(self._roots)
        while frontier:
            for target in self.nodes[frontier.pop()].successors():
                if target != END and target not in seen:
                    seen.add(target)
                    frontier.append(target)
        unreachable = [n for n in self.nodes if n not in seen]
        if unreachable:
            raise WorkflowDefinitionError(f"{where}: unreachable nodes {unreachable}")

    def _check_cycles(self, where: str, found: list[list[str]]) -> None:
        for cycle in found:
            if not any(self.nodes[n].max_visits for n in cycle):
                path = " -> ".join([*cycle, cycle[0]])
                raise WorkflowDefinitionError(
                    f"{where}: cycle {path} has no loop bound (set max_visits on one of its nodes)")

    # -- export --------------------------------------------------------------------------------

    def transition_table(self) -> list[tuple[str, str, str, str]]:
        """Rows ``(from, kind, condition, to)``; ``END`` finishes the task."""
        rows: list[tuple[str, str, str, str]] = []
        for node in self.nodes.values():
            rows.extend((node.name, node.kind, cond, to) for cond, to in node_edges(node))
        return rows

    def mermaid(self) -> str:
        """A Mermaid flowchart of the graph (paste into any Mermaid renderer)."""
        shapes = {"agent": "[/{}/]", "step": "[{}]", "choice": "{{{}}}", "route": "{{{{{}}}}}",
                  "fanout": "[[{}]]", "join": "[[{}]]", "approval": "([{}])", "wait": "([{}])",
                  "map": "[[{}]]", "loop": "[{}]", "sleep": "[({})]"}
        ids = {name: f"n{i}" for i, name in enumerate(self.nodes)}
        ids[END] = "END_"
        lines = ["flowchart TD", f"    START_(( )) --> {ids[self.start]}"]
        for name, node in self.nodes.items():
            label = f"{name} · {node.kind}"
            lines.append(f"    {ids[name]}{shapes[node.kind].format(label)}")
        lines.append("    END_((END))")
        for src, _, cond, dst in self.transition_table():
            target = ids.get(dst)
            if target is None:  # CANCELLED / FAILED outcomes
                target = f"{dst}_"
                if f"    {target}(({dst}))" not in lines:
                    lines.append(f"    {target}(({dst}))")
            lines.append(f'    {ids[src]} -->|"{cond}"| {target}')
        return "\n".join(lines)
