"""The store's figures for a metrics scrape (supervisors/observability/): the port
(:class:`MetricStore`, part of ``StorePort``) and the SQLite store's implementation
(:class:`MetricRows`, a mixin of ``Store``).

Read at scrape time rather than counted as things happen: the store already holds the
truth (tasks by status, open UNKNOWN actions and handoffs, dead letters, what tasks spent),
so a second, in-memory bookkeeping that could drift from it is not kept. Five grouped
reads; with 10,000 tasks they take a few milliseconds (bench/observe.py,
``metrics_scrape_ms``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ratchet.persistence.checkpoints import decode_optional
from ratchet.persistence.store_rows import _StoreParts

__all__ = ["MetricRows", "MetricStore", "StoreFigures"]


@dataclass
class StoreFigures:
    """What one scrape reads of the store. Ages are seconds before ``now``."""

    #: (tenant, status) → (tasks, seconds since the oldest of them last changed)
    tasks: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    #: tenant → (UNKNOWN actions, age of the oldest)
    unknown_actions: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: tenant → (open handoffs, age of the oldest)
    handoffs: dict[str, tuple[int, float]] = field(default_factory=dict)
    dead_letters: int = 0
    #: tenant → spending dimension (tokens, money, model_calls, ...) → total of its tasks
    spent: dict[str, dict[str, float]] = field(default_factory=dict)


@runtime_checkable
class MetricStore(Protocol):
    """What a metrics scrape reads."""

    #: Writes the store refused because the node's fencing token was no longer current
    #: (counted in the write's transaction; HeldLeases counts the ones refused before it).
    fenced_refused: int

    async def metric_figures(self, now: float) -> StoreFigures:
        """The grouped counts and ages of one scrape (ages measured from ``now``)."""
        ...


class MetricRows(_StoreParts):
    """:class:`MetricStore` on SQLite."""

    fenced_refused: int = 0

    async def metric_figures(self, now: float) -> StoreFigures:
        figures = StoreFigures()
        for tenant, status, n, oldest in await self._rows(
                "SELECT tenant, status, COUNT(*), MIN(updated_at) FROM tasks"
                " GROUP BY tenant, status"):
            figures.tasks[(tenant, status)] = (int(n), max(0.0, now - float(oldest)))
        for tenant, n, oldest in await self._rows(
                "SELECT tenant, COUNT(*), MIN(updated_at) FROM actions WHERE status = 'UNKNOWN'"
                " GROUP BY tenant"):
            figures.unknown_actions[tenant] = (int(n), max(0.0, now - float(oldest)))
        for tenant, n, oldest in await self._rows(
                "SELECT t.tenant, COUNT(*), MIN(h.created_at) FROM handoffs h"
                " JOIN tasks t ON t.task_id = h.task_id WHERE h.resolved_at IS NULL"
                " GROUP BY t.tenant"):
            figures.handoffs[tenant] = (int(n), max(0.0, now - float(oldest)))
        row = await self._row("SELECT COUNT(*) FROM dead_letters")
        figures.dead_letters = int(row[0]) if row else 0
        spent: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for tenant, packed in await self._rows(
                "SELECT tenant, spent FROM tasks WHERE spent IS NOT NULL"):
            for dim, amount in (decode_optional(packed) or {}).items():
                if isinstance(amount, int | float):
                    spent[tenant][dim] += amount
        figures.spent = {t: dict(dims) for t, dims in spent.items()}
        return figures
