"""Degradation: what an agent node does when its model fails or its budget runs low.

A node may declare ``degrade=Degradation(models=[smaller, ...], pressure=0.8, cached=True,
on_exhausted="fallback")``. Each turn then asks, in order:

1. the node's model — unless the task is under **budget pressure** (``pressure`` of its
   ``tokens`` or ``money`` budget spent), when the first fallback model is asked first;
2. each fallback model in turn, when the one before failed for good (its retries spent:
   a model's errors are retried like a read's, then the next model is asked);
3. with ``cached=True``, an answer recorded on this node for the identical request (the
   same conversation, tools and parameters: the request digest), within this tenant;
4. else the ``on_exhausted`` node (``"fail"``: the task fails, as without degradation).

Each step down is an ``agent.degraded`` event with the reason, and the turn records which
model (and version) answered, so results can be compared by model and configuration
(admin verb ``model-stats``).

The answer cache is per node process and in memory: bounded (``CACHE_ENTRIES``, least
recently used out first), keyed by (tenant, node, request digest), holding only answers
that were recorded. A restarted node starts with it empty.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["AnswerCache", "Degradation", "under_pressure"]

#: Answers kept for ``cached=True`` nodes, across tasks of the node process.
CACHE_ENTRIES = 2_000


@dataclass(frozen=True)
class Degradation:
    models: tuple[Any, ...] = ()  # Model objects or registry resource names, in order
    pressure: float | None = None  # fraction of the token or money budget spent
    cached: bool = False
    on_exhausted: str = "fail"

    def __post_init__(self) -> None:
        if self.pressure is not None and not 0 < self.pressure <= 1:
            raise ValueError(f"degradation pressure must be in (0, 1], got {self.pressure}")
        object.__setattr__(self, "models", tuple(self.models))


def under_pressure(pressure: float | None, budget: Mapping[str, float],
                   spent: Mapping[str, float]) -> str | None:
    """The budget dimension past its pressure mark, if any."""
    if pressure is None:
        return None
    for dim in ("tokens", "money"):
        limit = budget.get(dim)
        if limit and spent.get(dim, 0) >= pressure * limit:
            return dim
    return None


class AnswerCache:
    """Recorded model answers by (tenant, node, request digest), least recently used out."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self._answers: OrderedDict[tuple[str, str, str], dict[str, Any]] = OrderedDict()

    def get(self, tenant: str, node: str, digest: str) -> dict[str, Any] | None:
        key = (tenant, node, digest)
        answer = self._answers.get(key)
        if answer is not None:
            self._answers.move_to_end(key)
        return answer

    def put(self, tenant: str, node: str, digest: str, answer: dict[str, Any]) -> None:
        key = (tenant, node, digest)
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self.entries:
            self._answers.popitem(last=False)

    def __len__(self) -> int:
        return len(self._answers)
