"""Decisions on approvals at a pseudo-node — an approval the runtime asked for on its own,
not a graph's approval node: a gated tool call (``@gate``, actors/task/risk_gate.py) and a
failed plan re-validation (``@revalidate``, actors/task/revalidate.py). The crash-loop
guard's ``@recovery`` predates this module and checks its own.

Pseudo-node names start with ``@``, which no graph node's name can, so the graph's
approval handling never takes one for its own.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.task.kernel import TaskKernel
from ratchet.persistence.graph_rows import ApprovalWrite
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskStatus

__all__ = ["Decided", "pending_decision"]


class Decided:
    """A valid decision on a pending approval at a pseudo-node: what to commit with it."""

    def __init__(self, env: Envelope, row: dict[str, Any], decision: str) -> None:
        self.row, self.decision = row, decision
        self.approved = decision == "approve"
        self.decided_by = str(env.body.get("decided_by") or "unknown")
        self.reason = env.body.get("reason")
        #: The approval row settled, for the decision's own commit.
        self.settle = ApprovalWrite(row["approval_id"], "APPROVED" if self.approved
                                    else "REJECTED", decided_by=self.decided_by,
                                    reason=self.reason)

    def payload(self, kind: str, at_node: str) -> dict[str, Any]:
        """The ``approval.decided`` event's payload."""
        return {"kind": kind, "approval_id": self.row["approval_id"], "decision": self.decision,
                "decided_by": self.decided_by, "reason": self.reason, "at_node": at_node}


async def pending_decision(actor: TaskKernel, env: Envelope, node: str) -> Decided | str | None:
    """The decision in ``env`` on a pending approval at ``node``: None when the approval
    is not at that node (another handler's), a refusal (``late``, ``already approved``,
    ``request changed``, ``unknown approval``) for the task to answer, else the decision."""
    body = env.body
    decision = body.get("decision")
    if decision not in ("approve", "reject"):
        return None  # refused where every decision is checked
    row = await actor.deps.store.approval(str(body.get("approval_id", "")))
    if row is None or row["node"] != node:
        return None
    if row["task_id"] != actor.task_id:
        return "unknown approval"
    if actor.status is not TaskStatus.WAITING_APPROVAL:
        return "late"
    if row["status"] != "PENDING":
        return f"already {row['status'].lower()}"  # one-time: a repeat changes nothing
    if body.get("request_hash") not in (None, row["request_hash"]):
        return "request changed"  # the approver saw another request than the one pending
    return Decided(env, row, str(decision))
