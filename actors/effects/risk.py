"""Risk tiers at the tool gateway: a call that needs a human's approval (which ones:
actors/effects/risk_policy.py) is parked before anything of it is recorded or sent.

- **first time**: :class:`ApprovalRequired` — a handoff for a decision — and the task
  commits WAITING_APPROVAL with a handoff package holding the proposed call (tool, key,
  arguments with their secrets redacted, why it is gated) and a pending approval at the
  pseudo-node :data:`GATE_NODE` (``approval.requested``), in one transaction. No approval
  node in the graph is needed: any step, or an agent's turn, can be parked this way;
- **approved**: the task runs again (actors/task/risk_gate.py takes the decision) and the
  parked step runs again from its top, its completed calls answered by the ledger; the
  gated call finds its approval APPROVED and is made under its idempotency key, through
  the ledger: once;
- **rejected**: the call raises ``ActionFailed`` with code ``APPROVAL_REJECTED`` (never
  retried): a step may catch it and route; an agent gets it as the tool's error result;
  uncaught, the task fails (compensating) like any failed side effect.

The approval belongs to (task, idempotency key) — its id is derived from both
(:func:`gate_id`) — so a decision holds for the business action, not for one run of the
step: a rejected call asked again by the same task is refused again without asking. A key
already in the ledger is not gated again (it was approved before its row was written).
Compensations are never gated: an undo must not wait for the approval of an undo. A fan-out
branch cannot park its task: a gated call there fails the branch.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from ratchet.actors.effects.risk_policy import tightening, why_gated
from ratchet.actors.effects.signals import HandoffRequired
from ratchet.actors.effects.switches import Switches
from ratchet.actors.workflow.tools import Tool
from ratchet.persistence.graph_rows import ApprovalWrite
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import ActionFailed, ErrorCode
from ratchet.protocol.ids import request_hash
from ratchet.protocol.redaction import dump_model

__all__ = ["GATE_NODE", "ApprovalRequired", "GateEnv", "gate", "gate_id"]

#: The ``node`` of a gated call's approval row: no graph node (their names cannot start
#: with ``@``), so the graph's approval handling never takes it for one of its own.
GATE_NODE = "@gate"


class GateEnv(Protocol):
    """What the gate reads of the action runner's environment (``CallEnv``)."""

    task_id: str
    tenant: str
    store: TaskStore
    switches: Switches | None


class ApprovalRequired(HandoffRequired):
    """Control signal: the call waits for a human's approval (the task parks)."""


def gate_id(task_id: str, key: str) -> str:
    """The approval id of the call with ``key`` in ``task_id`` (stable across re-runs)."""
    return "apr_gate_" + hashlib.sha256(f"{task_id}\x00{key}".encode()).hexdigest()[:32]


async def gate(env: GateEnv, tool: Tool[Any, Any], args: Any, key: str | None,
               compensates: str | None) -> None:
    """Let the call through, or park it for approval, or refuse it (rejected).

    Raises:
        ApprovalRequired: no decision yet: the task parks until a human decides.
        ActionFailed: ``APPROVAL_REJECTED`` (a human refused this call), or ``CONFLICT``
            (the approved request is not this one).
    """
    if compensates is not None or key is None:
        return
    rule = tightening(env.switches.risk, env.tenant, tool.name) if env.switches else None
    why = why_gated(tool, args, rule)
    if why is None or await env.store.get_action(env.tenant, key) is not None:
        return
    approval_id = gate_id(env.task_id, key)
    row = await env.store.approval(approval_id)
    request = {"kind": "risk_gate", "tool": tool.name, "key": key, "args": dump_model(args),
               **why}
    digest = request_hash(env.store.secrets.canonical({"tool": tool.name,
                                                       "args": dump_model(args)}))
    if row is not None and row["status"] in ("APPROVED", "REJECTED"):
        if row["request_hash"] != digest:
            raise ActionFailed(f"{tool.name}: the approved request under {key} was another",
                               key=key, tool=tool.name)
        if row["status"] == "APPROVED":
            return
        failure = ActionFailed(f"{tool.name} was rejected by {row.get('decided_by')}"
                               f" ({row.get('reason') or 'no reason given'})", key=key,
                               tool=tool.name, approval_id=approval_id,
                               decided_by=row.get("decided_by"), reason=row.get("reason"))
        failure.code = ErrorCode.APPROVAL_REJECTED
        raise failure
    reason = f"{tool.name} needs approval: {why['why']}"
    package = {**request, "approval_id": approval_id, "request_hash": digest,
               "options": ["approve: the call is made (once, under its key)",
                           "reject: the step gets APPROVAL_REJECTED and may route on it"]}
    insert = ApprovalWrite(approval_id, "PENDING", insert=True, node=GATE_NODE,
                           request=request, request_hash=digest) if row is None else None
    raise ApprovalRequired(reason, package, approval=True, change={
        "approval": insert, "events": [(EventType.APPROVAL_REQUESTED, {
            "node": GATE_NODE, "approval_id": approval_id, "request": request,
            "request_hash": digest, "approvers": "", "expires_at": None})]})
