"""The loop node: a step that runs again and again, one checkpoint per iteration.

    @wf.loop(max_iterations=200)                      # 200 sequential durable steps
    async def crawl(ctx):
        return {"page": await fetch(ctx.state.get("next_url"))}

    @wf.loop(until=lambda s: s["done"], max_iterations=50, on_exhausted="give_up")
    async def poll(ctx): ...

Each iteration runs the body like a step (``ctx.iteration`` is its 0-based number), then
``until(state)`` decides, and one commit records both: the iteration's state changes, its
``step.completed`` event (with ``iteration``) and where the task goes next — the loop
again, ``next`` once ``until`` holds, ``on_exhausted`` when ``max_iterations`` ran without
it. Without ``until`` the loop runs exactly ``max_iterations`` times. A crash resumes at
the iteration after the last committed one. The runtime is ``actors/task/loop_runtime.py``;
docs/workflows.md, "Loops".

Why a node kind and not a step with a choice and ``max_visits`` around it: that costs two
commits per iteration (the step's, the choice's) and a graph of three nodes for one idea.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ratchet.actors.workflow.nodes import END, FAIL, Node, StepFn, StepNode
from ratchet.protocol.errors import WorkflowDefinitionError

__all__ = ["LoopBuilder", "LoopNode", "check_loop", "loop_edges"]

Until = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class LoopNode(StepNode):
    """A step run once per iteration (the task's ``visits[name]`` counts the iterations
    committed since the task entered the loop; leaving it clears the count)."""

    #: ``until(state) -> bool``, after each iteration; None: run ``max_iterations`` times.
    until: Until | None = None
    max_iterations: int = 1
    #: Where ``max_iterations`` without ``until`` leads: a node, or ``"fail"``.
    on_exhausted: str = FAIL
    kind = "loop"

    def successors(self) -> list[str]:
        # Its edge back to itself is the loop's own business, bounded by max_iterations:
        # not a graph cycle that would need a max_visits.
        out = [self.next]
        if self.until is not None and self.on_exhausted != FAIL:
            out.append(self.on_exhausted)
        return list(dict.fromkeys(out))


class LoopBuilder:
    """``Workflow.loop`` and ``Workflow.add_loop``, mixed into the workflow class."""

    name: str

    def _add(self, node: Node, implicit_next: bool = False) -> Node:
        raise NotImplementedError  # the Workflow's

    def loop(self, fn: StepFn | None = None, *, name: str | None = None,
             until: Until | None = None, max_iterations: int, on_exhausted: str = FAIL,
             next: str | None = None, timeout: float | None = None) -> Any:
        """Decorator adding a loop node: ``@wf.loop(max_iterations=200)`` or
        ``@wf.loop(until=..., max_iterations=..., next=..., on_exhausted=...)``."""

        def add(f: StepFn) -> StepFn:
            self.add_loop(name or f.__name__, f, until=until, max_iterations=max_iterations,
                          on_exhausted=on_exhausted, next=next, timeout=timeout)
            return f

        return add(fn) if fn is not None else add

    def add_loop(self, name: str, body: StepFn, *, until: Until | None = None,
                 max_iterations: int, on_exhausted: str = FAIL, next: str | None = None,
                 timeout: float | None = None) -> None:
        """A loop node running ``body`` (an async step function) once per iteration;
        ``timeout`` bounds each iteration, as a step's does."""
        where = f"workflow {self.name}: loop {name!r}"
        if not inspect.iscoroutinefunction(body):
            raise WorkflowDefinitionError(f"{where} must run an async function")
        if timeout is not None and timeout <= 0:
            raise WorkflowDefinitionError(f"{where} timeout must be > 0")
        self._add(LoopNode(name, body, next or END, timeout, until, max_iterations,
                           on_exhausted), implicit_next=next is None)


def check_loop(node: LoopNode, here: str) -> None:
    """Validate a loop node at registration; raises WorkflowDefinitionError naming it."""
    limit = node.max_iterations
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise WorkflowDefinitionError(f"{here}: max_iterations must be an int >= 1, got {limit!r}")
    if node.until is not None and not callable(node.until):
        raise WorkflowDefinitionError(f"{here}: until must be a function of the state")
    if node.until is None and node.on_exhausted != FAIL:
        raise WorkflowDefinitionError(f"{here}: on_exhausted needs an until (without one the"
                                      " loop ends after max_iterations and goes to next)")
    if node.max_visits is not None:
        raise WorkflowDefinitionError(f"{here}: a loop is bounded by max_iterations; bound an"
                                      " outer cycle on another of its nodes")


def loop_edges(node: LoopNode) -> list[tuple[str, str]]:
    """The loop's rows of the transition table: ``(condition, to)``, its own edge first."""
    n = node.max_iterations
    if node.until is None:
        return [(f"next iteration ({n} in all)", node.name), (f"{n} iterations done", node.next)]
    exhausted = "FAILED" if node.on_exhausted == FAIL else node.on_exhausted
    return [(f"until false (at most {n} iterations)", node.name), ("until true", node.next),
            (f"{n} iterations without until", exhausted)]
