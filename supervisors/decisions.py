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

from actors.bus import Bus, redelivery_delay
from actors.core import ServiceActor
from actors.task_actor import DeliverMail
from persistence.store import Store
from protocol.clock import Clock
from protocol.codec import decode_envelope, parse_body
from protocol.errors import InvalidMessage, NotFound, RatchetError
from protocol.messages import ApprovalDecision
from protocol.subjects import STREAM_DECISIONS, dlq_subject
from supervisors.tasks import TaskFinished, TaskSupervision

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
            ref = await self.tasks.ensure_running(decision.task_id)
            if ref is None:
                await msg.nak(delay=redelivery_delay(msg))
                return
            outcome = await ref.ask(DeliverMail(env), timeout=60.0,
                                    correlation_id=env.correlation_id)
            log.info("decision delivered", task_id=decision.task_id, outcome=outcome,
                     approval_id=decision.approval_id, decided_by=decision.decided_by)
            await msg.ack()
        except TaskFinished:
            await msg.ack()
        except RatchetError as exc:
            if exc.retryable:
                await msg.nak(delay=redelivery_delay(msg))
                return
            log.warning("decision dead-lettered", subject=msg.subject, error=exc.message)
            try:
                await self.store.record_dead_letter(
                    subject=msg.subject, raw=msg.data, error=exc.to_wire(),
                    dlq_subject=dlq_subject("decisions", tenant), now=self.clock.now())
            except Exception as store_exc:
                log.error("dead-letter failed", error=repr(store_exc))
                await msg.nak(delay=redelivery_delay(msg))
                return
            await msg.ack()
        except Exception as exc:
            log.error("decision routing failed; will retry", error=repr(exc))
            await msg.nak(delay=redelivery_delay(msg))
