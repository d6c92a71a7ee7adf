"""The decision router: approval decisions from people (or the admin service) to tasks.

An Envelope of type ``approval.decision`` with an :class:`ApprovalDecision` body arrives on
``ratchet.decisions.<tenant>``. The router validates it, checks the task belongs to the
subject's tenant (another tenant's task is NOT_FOUND: no existence leak), activates the
parked task and delivers; ack after the task answered. The decision must be signed by an
approver of the tenant (docs/security.md), who is recorded as ``decided_by``. Malformed or
misaddressed decisions are dead-lettered; a decision for a finished task is acked and
dropped.

Every decision that names a task is audited (persistence/admin_rows.py): by the task, which
applies or refuses it (actors/task/decision_audit.py), or here when it cannot reach the
task: another tenant's task (``NOT_FOUND``) or a finished one (``late``).
"""

from __future__ import annotations

from typing import Any

import structlog
from nats.aio.msg import Msg

from ratchet.persistence.admin_rows import AuditEntry
from ratchet.protocol.auth import Principal
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.codec import parse_body
from ratchet.protocol.errors import ErrorCode, NotFound
from ratchet.protocol.messages import ApprovalDecision, Envelope
from ratchet.protocol.states import TaskStatus, is_terminal
from ratchet.protocol.subjects import STREAM_DECISIONS, dlq_subject, tenant_of
from ratchet.supervisors.services.routing import Target, TaskRouter

__all__ = ["DecisionRouter"]

class DecisionRouter(TaskRouter):
    stream = STREAM_DECISIONS
    durable = "decision-router"
    filter_subject = "ratchet.decisions.>"
    expects = MessageType.APPROVAL_DECISION
    signed_service = "decisions"
    log = structlog.get_logger("ratchet.decisions")

    async def target(self, msg: Msg, env: Envelope, who: Principal | None) -> Target | None:
        # Who decided is the verified signer, whatever the body says.
        assert who is not None  # signed_service: the router verified the signature
        env = env.model_copy(update={"body": {**env.body, "decided_by": who.name}})
        decision = parse_body(env, ApprovalDecision)
        tenant = tenant_of(msg.subject)
        try:
            record = await self.store.load_task(decision.task_id)
        except NotFound:
            record = None
        if record is None or record.tenant != tenant:
            await self._audit(tenant, env, decision, ErrorCode.NOT_FOUND.value)
            raise NotFound("no such task", task_id=decision.task_id)
        if is_terminal(TaskStatus(record.status)):
            await self._audit(tenant, env, decision, "late")  # acked and dropped below
        return Target(decision.task_id, env, record)

    async def _audit(self, tenant: str, env: Envelope, decision: ApprovalDecision,
                     outcome: str) -> None:
        """Audit a decision that does not reach its task (the same entry as the task's)."""
        await self.store.audit(AuditEntry(
            tenant, self.clock.now(), decision.decided_by or "unknown", decision.decision, env.message_id,
            decision.task_id, outcome,
            {"approval_id": decision.approval_id, "reason": decision.reason,
             "request_hash": decision.request_hash, "correlation_id": env.correlation_id}))

    def dead_letters(self, msg: Msg) -> str:
        return dlq_subject("decisions", tenant_of(msg.subject))

    def delivered(self, target: Target, outcome: Any) -> None:
        self.log.info("decision delivered", task_id=target.task_id, outcome=outcome,
                      approval_id=target.envelope.body.get("approval_id"),
                      decided_by=target.envelope.body.get("decided_by"))
