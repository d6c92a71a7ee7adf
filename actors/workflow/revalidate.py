"""Plan re-validation on resume: a workflow's ``revalidate`` hook, asked before the task
goes on after it stood still — a pause, an approval, an external wait, a sleep, a handoff,
or a recovery (an actor restarted, a node's failover) — whether what it decided before
still holds: permissions still granted, external state unchanged, the plan still valid.

    @wf.revalidate(on_invalid="replan")       # or wf.revalidate(fn, on_invalid=None)
    async def still_valid(ctx: ratchet.RevalidateContext) -> bool | str:
        quote = await ctx.call(get_quote, {"order": ctx.state["order"]})
        return quote.price == ctx.state["price"] or "the price changed"

The hook returns True (go on) or False / a string saying why not. A hook that raises is a
failed check too: the task never goes on blindly. A failed check moves the task to the
``on_invalid`` node (a replan), or with None (the default) hands it to a human
(WAITING_APPROVAL: approve goes on, reject fails the task). How the task actor runs it:
``actors/task/revalidate.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ratchet.actors.workflow.nodes import Node
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.errors import WorkflowDefinitionError

__all__ = ["AFTER", "RevalidateBuilder", "RevalidateContext", "RevalidateFn", "verdict_of"]

#: Why the task stood still, by the status it was loaded in (RUNNING: it was recovered).
AFTER = {"PAUSED": "pause", "WAITING_APPROVAL": "approval", "WAITING_EXTERNAL": "external_wait",
         "SLEEPING": "sleep", "UNKNOWN": "handoff", "RUNNING": "recovery"}


@dataclass(slots=True)
class RevalidateContext:
    """What a ``revalidate`` hook sees."""

    task_id: str
    tenant: str
    workflow: str
    #: The node the task is about to run (a parked step runs again from its top).
    node: str
    #: Why it stood still: ``pause``, ``approval``, ``external_wait``, ``sleep``,
    #: ``handoff`` or ``recovery``.
    after: str
    #: Seconds since the task's last recorded change (how long it stood still).
    parked_s: float
    state: Mapping[str, Any]
    input: Mapping[str, Any]
    resources: Mapping[str, Any]
    runner: Any = None  # the task's ActionRunner (set by the task actor)

    async def call(self, tool: Tool[Any, Any], args: Any) -> Any:
        """Call a tool under the action protocol (a read, typically: look the world up)."""
        return await self.runner.call(tool, args)


RevalidateFn = Callable[[RevalidateContext], "Awaitable[bool | str] | bool | str"]


class RevalidateBuilder:
    """``Workflow.revalidate``, mixed into the workflow class."""

    name: str
    nodes: dict[str, Node]
    #: The hook (None: the task goes on after a resume without asking).
    revalidate_hook: RevalidateFn | None = None
    #: Where a failed check goes: a node (replan), or None for a human.
    on_invalid: str | None = None

    def revalidate(self, fn: RevalidateFn | None = None, *, on_invalid: str | None = None
                   ) -> Any:
        """Declare the re-validation hook: ``wf.revalidate(fn, on_invalid=...)`` or as a
        decorator, ``@wf.revalidate`` / ``@wf.revalidate(on_invalid="replan")``."""

        def add(f: RevalidateFn) -> RevalidateFn:
            if not callable(f) or self.revalidate_hook is not None:
                raise WorkflowDefinitionError(
                    f"workflow {self.name}: revalidate takes one callable, declared once")
            if on_invalid is not None and on_invalid.startswith("@"):
                raise WorkflowDefinitionError(f"workflow {self.name}: on_invalid must name a"
                                              " node, or be None for a human")
            self.revalidate_hook, self.on_invalid = f, on_invalid
            return f

        return add(fn) if fn is not None else add

    def _check_revalidate(self, where: str) -> None:
        if self.on_invalid is not None and self.on_invalid not in self.nodes:
            raise WorkflowDefinitionError(
                f"{where}: revalidate's on_invalid {self.on_invalid!r} is not a node")

    @property
    def _roots(self) -> list[str]:
        """Where a task may enter the graph: its first node, and the replan node."""
        first = next(iter(self.nodes))
        return [first] + ([self.on_invalid] if self.on_invalid else [])


async def verdict_of(hook: RevalidateFn, ctx: RevalidateContext) -> str | None:
    """Run the hook: None when the plan holds, else why not (a raise is a failed check)."""
    try:
        answer = hook(ctx)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:
        return f"revalidate raised {type(exc).__name__}: {str(exc)[:300]}"
    if answer is True:
        return None
    return answer if isinstance(answer, str) and answer else "revalidate said the plan no longer holds"
