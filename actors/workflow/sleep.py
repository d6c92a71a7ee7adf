"""The sleep node: a durable sleep in a workflow graph (``wf.sleep``).

    wf.sleep("cool_off", seconds=3600)                      # an hour after entering it
    wf.sleep("until_open", until=lambda s: s["opens_at"])   # an epoch time from the state

The task checkpoints on entering the node, parks as SLEEPING (no actor, no memory: a timer
row) and goes on to ``next`` once the wake time came, across node restarts.

A node re-runs nothing: the step before it committed its checkpoint, the one after starts
fresh. ``await ctx.sleep(...)`` inside a step is durable too (actors/task/step_sleep.py), but
a coroutine's frame cannot be saved, so that step runs again from its top when the timer
fires (its completed calls and sleeps answered at once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ratchet.actors.workflow.nodes import END, Node
from ratchet.protocol.errors import WorkflowDefinitionError

__all__ = ["SleepNode", "sleep_node"]

@dataclass(frozen=True)
class SleepNode(Node):
    """Park the task until ``seconds`` after entering the node, or until ``until(state)``
    (seconds since the epoch, a float); then go on to ``next``."""

    seconds: float | None
    until: Callable[[Mapping[str, Any]], float] | None
    next: str = END
    kind = "sleep"

    def successors(self) -> list[str]:
        return [self.next]

    @property
    def counts_visits(self) -> bool:
        # The timer id is per visit: a sleep inside a loop sleeps again at each visit.
        return True

    def edge_label(self) -> str:
        """The condition of its one edge, for the transition table and the diagram."""
        if self.seconds is not None:
            return f"{self.seconds:g}s elapsed"
        return "until(state) reached"


def sleep_node(name: str, seconds: float | None, until: Callable[[Mapping[str, Any]], float] | None,
               next: str, max_visits: int | None) -> SleepNode:
    """A sleep node, checked as it is declared.

    Raises:
        WorkflowDefinitionError: not exactly one of ``seconds`` and ``until``, a duration
            that is not a finite number > 0, or an ``until`` that is not callable.
    """
    here = f"sleep node {name!r}"
    if (seconds is None) == (until is None):
        raise WorkflowDefinitionError(f"{here}: give exactly one of seconds= and until=")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not math.isfinite(seconds) or seconds <= 0:
            raise WorkflowDefinitionError(f"{here}: seconds must be a number > 0, got {seconds!r}")
    elif not callable(until):
        raise WorkflowDefinitionError(f"{here}: until must be a function of the state")
    return SleepNode(name, float(seconds) if seconds is not None else None, until, next,
                     max_visits=max_visits)
