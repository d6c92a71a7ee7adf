"""The decision router: approval decisions from people (or the admin service) to tasks.

An Envelope of type ``approval.decision`` with an :class:`ApprovalDecision` body arrives on
``ratchet.decisions.<tenant>``. The router validates it, checks the task belongs to the
subject's tenant (another tenant's task is NOT_FOUND: no existence leak), activates the
parked task and delivers; ack after the task answered. Malformed or misaddressed decisions
are dead-lettered; a decision for a finished task is acked and dropped.
"""

from __future__ import annotations

import structlog
from nats.aio.msg import Msg

from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.codec import decode_envelope, parse_body
from ratchet.protocol.errors import InvalidMessage, NotFound
from ratchet.protocol.messages import ApprovalDecision
from ratchet.protocol.subjects import STREAM_DECISIONS, dlq_subject, tenant_of
from ratchet.supervisors.services.routing import TaskRouter, deliver, settle_failure

__all__ = ["DecisionRouter"]

log = structlog.get_logger("ratchet.decisions")


class DecisionRouter(TaskRouter):
    stream = STREAM_DECISIONS
    durable = "decision-router"
    filter_subject = "ratchet.decisions.>"

    async def route(self, msg: Msg) -> None:
        tenant = tenant_of(msg.subject)
        try:
            env = decode_envelope(msg.data)
            if env.type != MessageType.APPROVAL_DECISION:
                raise InvalidMessage(f"expected approval.decision, got {env.type!r}")
            decision = parse_body(env, ApprovalDecision)
            record = await self.store.load_task(decision.task_id)
            if record.tenant != tenant:
                raise NotFound("no such task", task_id=decision.task_id)
            outcome = await deliver(self.tasks, decision.task_id, env, msg, record=record)
            if outcome is None:
                return
            log.info("decision delivered", task_id=decision.task_id, outcome=outcome,
                     approval_id=decision.approval_id, decided_by=decision.decided_by)
            await msg.ack()
        except Exception as exc:
            await settle_failure(msg, exc, store=self.store, clock=self.clock,
                                 dlq=dlq_subject("decisions", tenant), log=log)
