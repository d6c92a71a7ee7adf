"""The mail router: delivers actor mail from JetStream to live (or activated) actors.

Mail arrives on ``ratchet.mail.<partition>.<task_id>.<actor>``. The router activates the
task's actor if needed, asks it to handle the message, and acks only after the actor
answered, that is after its effects committed. Repeats are dropped twice over: a small
in-memory window of recent message ids here, and the Store's inbox (in the effect's own
transaction) at the actor. Undeliverable mail is nak'ed with a delay and retried.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import structlog
from nats.aio.msg import Msg

from actors.bus import Bus, redelivery_delay
from actors.core import ServiceActor
from actors.task_actor import DeliverMail
from persistence.store import Store
from protocol.clock import Clock
from protocol.codec import decode_envelope
from protocol.errors import NotFound, RatchetError
from protocol.subjects import STREAM_MAIL, dlq_subject
from supervisors.tasks import TaskFinished, TaskSupervision

__all__ = ["MailRouter"]

log = structlog.get_logger("ratchet.mail")


class MailRouter(ServiceActor):
    def __init__(self, bus: Bus, tasks: TaskSupervision, store: Store, clock: Clock,
                 filter_subject: str = "ratchet.mail.>", durable: str = "mail-router",
                 recent_window: int = 10_000) -> None:
        self.bus = bus
        self.tasks = tasks
        self.store = store
        self.clock = clock
        self.filter_subject = filter_subject
        self.durable = durable
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._recent_window = recent_window

    async def serve(self) -> None:
        await self.bus.pull_loop(STREAM_MAIL, self.durable, self.filter_subject, self._batch,
                                 batch=512)

    async def _batch(self, msgs: list[Msg]) -> None:
        await asyncio.gather(*(self._route(m) for m in msgs))

    def _seen(self, message_id: str) -> bool:
        if message_id in self._recent:
            return True
        self._recent[message_id] = None
        if len(self._recent) > self._recent_window:
            self._recent.popitem(last=False)
        return False

    async def _route(self, msg: Msg) -> None:
        parts = msg.subject.split(".")
        try:
            env = decode_envelope(msg.data)
            if len(parts) != 5:
                raise NotFound("mail subject does not name a task actor", subject=msg.subject)
            task_id = parts[3]
            if env.message_id in self._recent:
                await msg.ack()
                return
            ref = await self.tasks.ensure_running(task_id)
            if ref is None:
                await msg.nak(delay=redelivery_delay(msg))  # between restarts: try again shortly
                return
            outcome = await ref.ask(DeliverMail(env), timeout=60.0,
                                    correlation_id=env.correlation_id)
            self._seen(env.message_id)
            log.debug("mail delivered", task_id=task_id, outcome=outcome,
                      message_id=env.message_id)
            await msg.ack()
        except TaskFinished:
            await msg.ack()  # late mail for a finished task: nothing to do
        except RatchetError as exc:
            if exc.retryable:
                await msg.nak(delay=redelivery_delay(msg))
                return
            log.warning("mail dead-lettered", subject=msg.subject, error=exc.message)
            try:
                await self.store.record_dead_letter(
                    subject=msg.subject, raw=msg.data, error=exc.to_wire(),
                    dlq_subject=dlq_subject("mail", "_system"), now=self.clock.now())
            except Exception as store_exc:
                log.error("dead-letter failed", error=repr(store_exc))
                await msg.nak(delay=redelivery_delay(msg))
                return
            await msg.ack()
        except Exception as exc:
            log.error("mail routing failed; will retry", error=repr(exc))
            await msg.nak(delay=redelivery_delay(msg))
