"""The external router: confirmations of accepted (202) actions, from the outside world.

A provider (or its webhook relay) publishes an Envelope of type ``external.resolved`` on
``ratchet.external.<tenant>`` with body ``{correlation_id, key, outcome: "completed" |
"failed", result, error}``. The router finds the open wait for the correlation id, activates
the waiting task's actor and delivers it; ack after the actor committed. A confirmation
nobody waits for (unknown, or already resolved) is dead-lettered, never applied twice.
"""

from __future__ import annotations

import structlog
from nats.aio.msg import Msg

from ratchet.actors.transport.bus import redelivery_delay
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.codec import decode_envelope
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.subjects import STREAM_EXTERNAL, dlq_subject, tenant_of
from ratchet.supervisors.services.routing import (
    TaskRouter,
    deliver,
    deliveries,
    settle_failure,
)

__all__ = ["ExternalRouter", "EARLY_RETRIES"]

#: How many deliveries a confirmation gets while no wait for it is open (backing off
#: 0.5 s, 1 s, 2 s, ...), before it is dead-lettered.
EARLY_RETRIES = 5


log = structlog.get_logger("ratchet.external")


class ExternalRouter(TaskRouter):
    stream = STREAM_EXTERNAL
    durable = "external-router"
    filter_subject = "ratchet.external.>"

    async def route(self, msg: Msg) -> None:
        tenant = tenant_of(msg.subject)
        try:
            env = decode_envelope(msg.data)
            if env.type != MessageType.EXTERNAL_RESOLVED:
                raise InvalidMessage(f"expected external.resolved, got {env.type!r}")
            cid = env.body.get("correlation_id")
            if not isinstance(cid, str) or not cid:
                raise InvalidMessage("external.resolved needs a correlation_id")
            wait = await self.store.find_wait(tenant, cid)
            if wait is None:
                if deliveries(msg) < EARLY_RETRIES:
                    # A webhook may overtake the 202 that makes the task record its wait.
                    await msg.nak(delay=redelivery_delay(msg))
                    return
                raise InvalidMessage("no open wait for this correlation id",
                                     correlation_id=cid, tenant=tenant)
            task_id, kind = wait
            body = dict(env.body)
            body["wait_kind"] = kind
            if kind.startswith("action:"):
                body.setdefault("key", kind.removeprefix("action:"))
            env = env.model_copy(update={"body": body})
            outcome = await deliver(self.tasks, task_id, env, msg)
            if outcome is None:
                return
            log.info("confirmation delivered", task_id=task_id, correlation_id=cid,
                     outcome=outcome)
            await msg.ack()
        except Exception as exc:
            await settle_failure(msg, exc, store=self.store, clock=self.clock,
                                 dlq=dlq_subject("external", tenant), log=log)
