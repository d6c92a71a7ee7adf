"""A human's decision on a gated tool call (actors/effects/risk.py): approve or reject,
the task goes back to RUNNING either way and the parked step runs again from its top.

The decision is in the approval row, which the re-run call reads: approved, the call is
made (once, under its key, through the ledger); rejected, it raises ``ActionFailed`` with
``APPROVAL_REJECTED`` for the step (or the agent) to handle. Decided in one transaction
with its ``approval.decided`` event and its audit entry (actors/task/decision_audit.py).
"""

from __future__ import annotations

from ratchet.actors.effects.risk import GATE_NODE
from ratchet.actors.task.decision_audit import decision_entry
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.pseudo_approvals import pending_decision
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent

__all__ = ["RISK_GATE", "on_gate_decision"]

#: The ``kind`` of a gated call's decision (its event and its audit entry).
RISK_GATE = "risk_gate"


async def on_gate_decision(actor: TaskKernel, env: Envelope) -> str | None:
    """Apply a decision on a gated call; None when the approval is not a gated call's."""
    decided = await pending_decision(actor, env, GATE_NODE)
    if decided is None or isinstance(decided, str):
        return decided
    request = decided.row["request"] or {}
    await actor.commit(
        status_event=TaskEvent.APPROVAL_DECIDED, approval=decided.settle,
        inbox_message_id=env.message_id, audit=decision_entry(actor, env, "applied", RISK_GATE),
        events=[(EventType.APPROVAL_DECIDED, {**decided.payload(RISK_GATE, actor.current),
                                              "tool": request.get("tool"),
                                              "key": request.get("key")})])
    actor.log.warning("gated call decided", decision=decided.decision,
                      decided_by=decided.decided_by, tool=request.get("tool"))
    actor.advance()  # the parked step runs again; its call reads the decision
    return "processed"
