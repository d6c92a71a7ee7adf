"""Approval decisions in the audit log: who decided which approval of which task, and
what became of the decision.

A decision reaches a task from the admin verbs ``approve``/``reject`` (which audit the
command too) or from ``ratchet.decisions.<tenant>`` (which checks no role: this entry is
the only record of who claimed to decide). One entry per decision the task handled:

- applied: outcome ``applied``, written in the decision's own transaction
  (``TaskChange.audit``), so a decision is never in effect without its entry;
- refused: outcome the task's answer (``late``, ``expired``, ``already approved``,
  ``request changed``, ``unknown approval``), written after it.

A crash-loop handoff resolved by a decision is ``kind: crash_loop`` in the entry's detail;
a graph approval node's, ``kind: approval``.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.task.kernel import TaskKernel
from ratchet.persistence.admin_rows import AuditEntry
from ratchet.protocol.messages import Envelope

__all__ = ["APPROVAL", "CRASH_LOOP", "decision_entry", "record_refused"]

#: The detail's ``kind`` of a crash-loop handoff's decision (a handoff resolution).
CRASH_LOOP = "crash_loop"
#: ... and of a graph approval node's.
APPROVAL = "approval"


def decision_entry(actor: TaskKernel, env: Envelope, outcome: str,
                   kind: str | None = None) -> AuditEntry:
    """The audit entry of the decision ``env`` with ``outcome``."""
    body = env.body
    assert actor.record is not None  # a task actor handles mail once loaded
    detail: dict[str, Any] = {"approval_id": body.get("approval_id"),
                              "reason": body.get("reason"),
                              "request_hash": body.get("request_hash"),
                              "correlation_id": env.correlation_id}
    if kind is not None:
        detail["kind"] = kind
    return AuditEntry(actor.record.tenant, actor.deps.clock.now(),
                      str(body.get("decided_by") or "unknown"), str(body.get("decision")),
                      env.message_id, actor.task_id, outcome, detail)


async def record_refused(actor: TaskKernel, env: Envelope, outcome: str) -> None:
    """Audit a decision the task did not apply (its answer is ``outcome``)."""
    await actor.deps.store.audit(decision_entry(actor, env, outcome))
