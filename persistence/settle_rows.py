"""What waits for a human, by tenant: pending approvals and open handoffs. The port the
admin verbs ``approvals`` and ``get`` use (:class:`SettleStore`, part of ``StorePort``) and
the SQLite store's implementation of it (:class:`SettleRows`, a mixin of ``Store``).

A handoff is open while its ``resolved_at`` is NULL; a task change that moves the task out
of UNKNOWN or WAITING_APPROVAL sets it (persistence/txns.py). Only tasks still in one of
those statuses are listed (an approval: of a task WAITING_APPROVAL): a handoff or an
approval of a task that moved on — cancelled, say — is not waiting for anyone.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.store_rows import _StoreParts

__all__ = ["SettleRows", "SettleStore"]

_APPROVAL_COLUMNS = ("approval_id, node, request_hash, approvers, expires_at, created_at")


def _approval(r: Any) -> dict[str, Any]:
    return {"approval_id": r[0], "node": r[1], "request_hash": r[2], "approvers": r[3],
            "expires_at": r[4], "created_at": r[5]}


@runtime_checkable
class SettleStore(Protocol):
    """Reads of what waits for a human (docs/admin.md, "Settling what a machine could not")."""

    async def awaiting_humans(self, tenant: str, limit: int) -> list[dict[str, Any]]:
        """The tenant's pending approvals and open handoffs, oldest first (at most
        ``limit``): ``kind`` (``approval`` or ``handoff``), ``task_id``, ``workflow``,
        ``status`` (the task's), ``created_at``; an approval's ``approval_id``, ``node``,
        ``request_hash``, ``approvers``, ``expires_at``; a handoff's ``handoff_id``,
        ``reason``, ``why`` and ``key``."""
        ...

    async def pending_approval(self, task_id: str) -> dict[str, Any] | None:
        """The task's newest PENDING approval (``approval_id``, ``node``, ``request_hash``,
        ``approvers``, ``expires_at``, ``created_at``), or None."""
        ...


class SettleRows(_StoreParts):
    """:class:`SettleStore` on SQLite, and ``TaskStore.task_approvals``."""

    async def awaiting_humans(self, tenant: str, limit: int) -> list[dict[str, Any]]:
        # Two bounded reads merged in Python rather than one UNION: the handoff's package
        # is msgpack and only its ``why``/``key`` are shown.
        approvals = await self._rows(
            "SELECT a.approval_id, a.node, a.request_hash, a.approvers, a.expires_at,"
            " a.created_at, t.task_id, t.workflow, t.status FROM approvals a"
            " JOIN tasks t ON t.task_id = a.task_id"
            " WHERE t.tenant = ? AND a.status = 'PENDING' AND t.status = 'WAITING_APPROVAL'"
            " ORDER BY a.created_at LIMIT ?", (tenant, limit))
        handoffs = await self._rows(
            "SELECT h.id, h.reason, h.package, h.created_at, t.task_id, t.workflow, t.status"
            " FROM handoffs h JOIN tasks t ON t.task_id = h.task_id"
            " WHERE t.tenant = ? AND h.resolved_at IS NULL"
            " AND t.status IN ('UNKNOWN', 'WAITING_APPROVAL')"
            " ORDER BY h.created_at LIMIT ?", (tenant, limit))
        out = [{"kind": "approval", **_approval(r), "task_id": r[6], "workflow": r[7],
                "status": r[8]} for r in approvals]
        for r in handoffs:
            package = _unpack(r[2]) or {}
            out.append({"kind": "handoff", "handoff_id": r[0], "reason": r[1],
                        "why": package.get("why"), "key": package.get("key"),
                        "created_at": r[3], "task_id": r[4], "workflow": r[5],
                        "status": r[6]})
        out.sort(key=lambda row: (row["created_at"], row["kind"]))
        return out[:limit]

    async def pending_approval(self, task_id: str) -> dict[str, Any] | None:
        r = await self._row(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE task_id = ? AND status ="
            " 'PENDING' ORDER BY created_at DESC LIMIT 1", (task_id,))
        return None if r is None else _approval(r)

    async def task_approvals(self, task_id: str) -> list[dict[str, Any]]:
        rows = await self._rows(
            f"SELECT {_APPROVAL_COLUMNS}, status, decided_by, decided_at FROM approvals"
            " WHERE task_id = ? ORDER BY created_at", (task_id,))
        return [{**_approval(r), "status": r[6], "decided_by": r[7], "decided_at": r[8]}
                for r in rows]
