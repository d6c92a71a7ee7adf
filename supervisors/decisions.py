"""The decision router: approval decisions from people (or the admin service) to tasks.

An Envelope of type ``approval.decision`` with an :class:`ApprovalDecision` body arrives on
``ratchet.decisions.<tenant>``. The router validates it, checks the task belongs to the
subject's tenant (another tenant's task is NOT_FOUND: no existence leak), activates the
parked task and delivers; ack after the task answered. Malformed or misaddressed decisions
are dead-lettered; a decision for a finished task is acked and dropped.
"""

from __future__ import annotations

import asyncio

import structlog
from nats.aio.msg import Msg

from actors.bus import Bus
from actors.core import ServiceActor
from persistence.store import Store
from protocol.clock import Clock
from protocol.codec import decode_envelope, parse_body
from protocol.errors import InvalidMessage, NotFound
from protocol.messages import ApprovalDecision
from protocol.subjects import STREAM_DECISIONS, dlq_subject
from supervisors.routing import deliver, settle_failure
from supervisors.tasks import TaskSupervision

__all__ = ["DecisionRouter"]

log = structlog.get_logger("ratchet.decisions")


class DecisionRouter(ServiceActor):
    def __init__(self, bus: Bus, tasks: TaskSupervision, store: Store, clock: Clock) -> None:
        self.bus = bus
        self.tasks = tasks
        self.store = store
        self.clock = clock

    async def serve(self) -> None:
        await self.bus.pull_loop(STREAM_DECISIONS, "decision-router", "ratchet.decisions.>",
                                 self._batch, batch=256)

    async def _batch(self, msgs: list[Msg]) -> None:
        await asyncio.gather(*(self._route(m) for m in msgs))

    async def _route(self, msg: Msg) -> None:
        tenant = msg.subject.split(".", 2)[2] if msg.subject.count(".") >= 2 else ""
        try:
            env = decode_envelope(msg.data)
            if env.type != "approval.decision":
                raise InvalidMessage(f"expected approval.decision, got {env.type!r}")
            decision = parse_body(env, ApprovalDecision)
            record = await self.store.load_task(decision.task_id)
            if record.tenant != tenant:
                raise NotFound("no such task", task_id=decision.task_id)
            outcome = await deliver(self.tasks, decision.task_id, env, msg)
            if outcome is None:
                return
            log.info("decision delivered", task_id=decision.task_id, outcome=outcome,
                     approval_id=decision.approval_id, decided_by=decision.decided_by)
            await msg.ack()
        except Exception as exc:
            await settle_failure(msg, exc, store=self.store, clock=self.clock,
                                 dlq=dlq_subject("decisions", tenant), log=log)
