"""Ledger reads of the action sweeper (supervisors/services/action_sweeper.py): which
tasks hold writes whose outcome nobody has settled for a while. The port
(:class:`SweepStore`, part of ``StorePort``) and the SQLite store's implementation
(:class:`SweepRows`, a mixin of ``Store``)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ratchet.persistence.store_rows import _StoreParts

__all__ = ["UNSETTLED", "UNSETTLED_DDL", "SweepRows", "SweepStore"]

#: The ledger states of a write whose outcome is not known (an accepted write, waiting for
#: the provider's confirmation, is IN_FLIGHT too, but its task is waiting for it).
UNSETTLED = ("IN_FLIGHT", "UNKNOWN")

#: Migration 17: the sweeper's scan reads only the few rows not settled (a partial index:
#: a row enters it with IN_FLIGHT and leaves it with its outcome).
UNSETTLED_DDL = """
    CREATE INDEX actions_unsettled_since ON actions(updated_at)
        WHERE status IN ('IN_FLIGHT', 'UNKNOWN') AND accepted = 0 AND kind = 'write';
"""


@runtime_checkable
class SweepStore(Protocol):
    """What the action sweeper reads."""

    async def stale_unsettled(self, before: float, limit: int = 500
                              ) -> list[tuple[str, str, str]]:
        """(task_id, tenant, task status) of each task holding a write (not a compensation:
        the saga settles those) IN_FLIGHT (not accepted) or UNKNOWN whose row has not
        changed since ``before``, oldest first; tasks with an open handoff are a human's."""
        ...


class SweepRows(_StoreParts):
    """:class:`SweepStore` on SQLite."""

    async def stale_unsettled(self, before: float, limit: int = 500
                              ) -> list[tuple[str, str, str]]:
        rows = await self._rows(
            "SELECT a.task_id, t.tenant, t.status, MIN(a.updated_at) AS since"
            " FROM actions a JOIN tasks t ON t.task_id = a.task_id"
            " WHERE a.status IN ('IN_FLIGHT', 'UNKNOWN') AND a.accepted = 0"
            " AND a.kind = 'write' AND a.compensates IS NULL AND a.updated_at < ?"
            " AND NOT EXISTS (SELECT 1 FROM handoffs h WHERE h.task_id = a.task_id"
            " AND h.resolved_at IS NULL)"
            " GROUP BY a.task_id, t.tenant, t.status ORDER BY since LIMIT ?", (before, limit))
        return [(r[0], r[1], r[2]) for r in rows]
