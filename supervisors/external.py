"""The external router: confirmations of accepted (202) actions, from the outside world.

A provider (or its webhook relay) publishes an Envelope of type ``external.resolved`` on
``ratchet.external.<tenant>`` with body ``{correlation_id, key, outcome: "completed" |
"failed", result, error}``. The router finds the open wait for the correlation id, activates
the waiting task's actor and delivers it; ack after the actor committed. A confirmation
nobody waits for (unknown, or already resolved) is dead-lettered, never applied twice.
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
from protocol.codec import decode_envelope
from protocol.errors import InvalidMessage, RatchetError
from protocol.subjects import STREAM_EXTERNAL, dlq_subject
from supervisors.tasks import TaskSupervision

__all__ = ["ExternalRouter"]

log = structlog.get_logger("ratchet.external")


class ExternalRouter(ServiceActor):
    def __init__(self, bus: Bus, tasks: TaskSupervision, store: Store, clock: Clock) -> None:
        self.bus = bus
        self.tasks = tasks
        self.store = store
        self.clock = clock

    async def serve(self) -> None:
        await self.bus.pull_loop(STREAM_EXTERNAL, "external-router", "ratchet.external.>",
                                 self._batch, batch=256)

    async def _batch(self, msgs: list[Msg]) -> None:
        await asyncio.gather(*(self._route(m) for m in msgs))

    async def _route(self, msg: Msg) -> None:
        tenant = msg.subject.split(".", 2)[2] if msg.subject.count(".") >= 2 else ""
        try:
            env = decode_envelope(msg.data)
            if env.type != "external.resolved":
                raise InvalidMessage(f"expected external.resolved, got {env.type!r}")
            cid = env.body.get("correlation_id")
            if not isinstance(cid, str) or not cid:
                raise InvalidMessage("external.resolved needs a correlation_id")
            wait = await self.store.find_wait(tenant, cid)
            if wait is None:
                raise InvalidMessage("no open wait for this correlation id",
                                     correlation_id=cid, tenant=tenant)
            task_id, kind = wait
            body = dict(env.body)
            body["wait_kind"] = kind
            if kind.startswith("action:"):
                body.setdefault("key", kind.removeprefix("action:"))
            env = env.model_copy(update={"body": body})
            ref = await self.tasks.ensure_running(task_id)
            if ref is None:
                await msg.nak(delay=redelivery_delay(msg))
                return
            outcome = await ref.ask(DeliverMail(env), timeout=60.0,
                                    correlation_id=env.correlation_id)
            log.info("confirmation delivered", task_id=task_id, correlation_id=cid,
                     outcome=outcome)
            await msg.ack()
        except RatchetError as exc:
            if exc.retryable:
                await msg.nak(delay=redelivery_delay(msg))
                return
            log.warning("confirmation dead-lettered", subject=msg.subject, error=exc.message)
            try:
                await self.store.record_dead_letter(
                    subject=msg.subject, raw=msg.data, error=exc.to_wire(),
                    dlq_subject=dlq_subject("external", tenant), now=self.clock.now())
            except Exception as store_exc:
                log.error("dead-letter failed", error=repr(store_exc))
                await msg.nak(delay=redelivery_delay(msg))
                return
            await msg.ack()
        except Exception as exc:
            log.error("confirmation routing failed; will retry", error=repr(exc))
            await msg.nak(delay=redelivery_delay(msg))
