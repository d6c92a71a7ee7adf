"""The map node: a fan-out over a list computed at run time, one branch per item.

    wf.map("fetch_all", items=lambda s: s["urls"], branch=fetch_page, into="pages",
           max_concurrency=8)

``items(state)`` returns a list (or tuple); each item runs ``branch`` — an async step
function, or a small ``Workflow`` of steps, choices and routes like a static fan-out's
branches — as one branch whose state starts as ``{"item": item, "index": i}``. At most
``max_concurrency`` run at once. The join is built in: ``policy`` (mode ``all`` or
``at_least``, and a ``timeout``) decides as it does for a static fan-out, and the results
land in ``state[into]`` as a list in item order (None for an item that did not succeed).

Why one node and not a fan-out/join pair: the branches' names are only known at run time,
so nothing could name them in a join's ``required`` or ``defaults``; the node reads like
Step Functions' ``Map`` state (items, concurrency, one result per item, in order), and,
unlike LangGraph's ``Send``, needs no reducer to gather its results. The runtime is
``actors/task/map_runtime.py``; docs/workflows.md, "Map: a fan-out over a list".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratchet.actors.workflow.nodes import (
    END,
    BranchGraph,
    JoinPolicy,
    Node,
    StepFn,
    StepNode,
)
from ratchet.protocol.errors import WorkflowDefinitionError

__all__ = ["DEFAULT_MAX_ITEMS", "MAX_MAP_ITEMS", "MapBuilder", "MapNode", "StepGraph",
           "check_map", "check_retries", "map_edges"]

#: The most items a map may be declared to take (``max_items``): each is a branch row, a
#: branch actor and an entry of the join's completion set.
MAX_MAP_ITEMS = 10_000
#: ``max_items`` when the map declares none.
DEFAULT_MAX_ITEMS = 1_000

Items = Callable[[Mapping[str, Any]], Sequence[Any]]


@dataclass(frozen=True)
class StepGraph:
    """A one-step branch graph: what an async function given as a map's ``branch`` runs as."""

    name: str
    step: StepNode

    @property
    def start(self) -> str:
        return self.step.name

    def node(self, name: str) -> Node:
        return self.step

    def validate(self, *, as_branch: bool = False) -> None:
        """Nothing to check beyond what building it checked (an async function)."""


@dataclass(frozen=True)
class MapNode(Node):
    #: ``items(state) -> list``: one branch per item; evaluated on the checkpointed state,
    #: again when a crashed map resumes, so it must depend on the state alone (like a guard).
    items: Items
    branch: BranchGraph
    #: The state key the results land in (a list in item order).
    into: str
    policy: JoinPolicy = field(default_factory=JoinPolicy)
    #: At most this many items run at once (None: the fan-out default).
    max_concurrency: int | None = None
    #: Each item's own time budget (seconds), counted from its turn: a static fan-out's
    #: ``branch_timeout``.
    item_timeout: float | None = None
    #: A longer list fails the task (``TooManyItems``) before any item runs.
    max_items: int = DEFAULT_MAX_ITEMS
    next: str = END
    #: An item's branch whose body raises runs again, from its last committed step, this
    #: many times (a static fan-out's ``branch_retries``).
    item_retries: int = 0
    kind = "map"

    def successors(self) -> list[str]:
        return [self.next]

    @property
    def counts_visits(self) -> bool:
        """Always: its branches are keyed by visit, as a fan-out's are."""
        return True


class MapBuilder:
    """``Workflow.map``, mixed into the workflow class (``actors/workflow/graph.py``)."""

    name: str

    def _add(self, node: Node, implicit_next: bool = False) -> Node:
        raise NotImplementedError  # the Workflow's

    def map(self, name: str, *, items: Items, branch: StepFn | BranchGraph,
            into: str | None = None, policy: JoinPolicy | None = None,
            max_concurrency: int | None = None, item_timeout: float | None = None,
            max_items: int = DEFAULT_MAX_ITEMS, next: str | None = None,
            max_visits: int | None = None, item_retries: int = 0) -> None:
        """A fan-out over ``items(state)``: ``branch`` runs once per item, at most
        ``max_concurrency`` at once, and ``state[into]`` (default: the node's name) gets
        the results in item order. ``next``: the node declared after it by default.
        ``item_retries``: an item's branch that raises runs again, from its last committed
        step, this many times."""
        graph: BranchGraph
        if inspect.iscoroutinefunction(branch):
            step = StepNode(getattr(branch, "__name__", "item"), branch)
            graph = StepGraph(f"{self.name}.{name}", step)
        elif all(hasattr(branch, a) for a in ("start", "node", "validate")):
            graph = branch  # type: ignore[assignment]  # a Workflow (graph.py imports us)
        else:
            raise WorkflowDefinitionError(f"workflow {self.name}: map {name!r}: branch must be"
                                          " an async function or a Workflow")
        self._add(MapNode(name, items, graph, into or name, policy or JoinPolicy(),
                          max_concurrency, item_timeout, max_items, next or END,
                          max_visits=max_visits, item_retries=item_retries),
                  implicit_next=next is None)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_retries(value: Any, name: str, here: str) -> None:
    """A fan-out's retries of a failed branch: an int >= 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WorkflowDefinitionError(f"{here}: {name} must be an int >= 0, got {value!r}")


def check_map(node: MapNode, here: str) -> None:
    """Validate a map node at registration; raises WorkflowDefinitionError naming it."""
    if not callable(node.items):
        raise WorkflowDefinitionError(f"{here}: items must be a function of the state")
    if not isinstance(node.into, str) or not node.into:
        raise WorkflowDefinitionError(f"{here}: into must be a state key (a non-empty str)")
    check_retries(node.item_retries, "item_retries", here)
    if node.max_concurrency is not None and not _positive_int(node.max_concurrency):
        raise WorkflowDefinitionError(
            f"{here}: max_concurrency must be an int >= 1, got {node.max_concurrency!r}")
    if not _positive_int(node.max_items) or node.max_items > MAX_MAP_ITEMS:
        raise WorkflowDefinitionError(f"{here}: max_items must be an int from 1 to"
                                      f" {MAX_MAP_ITEMS}, got {node.max_items!r}")
    for what, value in (("item_timeout", node.item_timeout), ("timeout", node.policy.timeout)):
        if value is not None and not value > 0:
            raise WorkflowDefinitionError(f"{here}: {what} must be > 0")
    policy = node.policy
    if policy.mode not in ("all", "at_least"):
        raise WorkflowDefinitionError(f"{here}: a map's policy mode is 'all' or 'at_least'"
                                      " (its items are not known before it runs)")
    if policy.required or policy.defaults:
        raise WorkflowDefinitionError(f"{here}: a map's policy cannot name items in required"
                                      " or defaults (they are known only at run time)")
    if policy.mode == "at_least" and not _positive_int(policy.k):
        raise WorkflowDefinitionError(f"{here}: at_least needs k >= 1")
    node.branch.validate(as_branch=True)


def map_edges(node: MapNode) -> list[tuple[str, str]]:
    """The map's rows of the transition table: ``(condition, to)``."""
    at_once = f", {node.max_concurrency} at once" if node.max_concurrency else ""
    mode = node.policy.mode if node.policy.mode == "all" else f"at_least {node.policy.k}"
    return [(f"policy {mode} met (a branch per item{at_once})", node.next),
            ("policy failed", "FAILED")]
