"""The decision router: approval decisions from people (or the admin service) to tasks.

An Envelope of type ``approval.decision`` with an :class:`ApprovalDecision` body arrives on
``ratchet.decisions.<tenant>``. The router validates it, checks the task belongs to the
subject's tenant (another tenant's task is NOT_FOUND: no existence leak), activates the
parked task and delivers; ack after the task answered. The decision must be signed by an
approver of the tenant (docs/security.md), who is recorded as ``decided_by``. Malformed or misaddressed decisions
are dead-lettered; a decision for a finished task is acked and dropped.
"""

from __future__ import annotations

from typing import Any

import structlog
from nats.aio.msg import Msg

from ratchet.protocol.auth import Principal
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.codec import parse_body
from ratchet.protocol.errors import NotFound
from ratchet.protocol.messages import ApprovalDecision, Envelope
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
        decision = parse_body(env, ApprovalDecision)
        record = await self.store.load_task(decision.task_id)
        if record.tenant != tenant_of(msg.subject):
            raise NotFound("no such task", task_id=decision.task_id)
        # Who decided is the verified signer, whatever the body says.
        assert who is not None  # signed_service: the router verified the signature
        body = {**env.body, "decided_by": who.name}
        return Target(decision.task_id, env.model_copy(update={"body": body}), record)

    def dead_letters(self, msg: Msg) -> str:
        return dlq_subject("decisions", tenant_of(msg.subject))

    def delivered(self, target: Target, outcome: Any) -> None:
        self.log.info("decision delivered", task_id=target.task_id, outcome=outcome,
                      approval_id=target.envelope.body.get("approval_id"),
                      decided_by=target.envelope.body.get("decided_by"))
