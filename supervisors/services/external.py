"""The external router: confirmations of accepted (202) actions, from the outside world.

A provider (or its webhook relay) publishes an Envelope of type ``external.resolved`` on
``ratchet.external.<tenant>`` with body ``{correlation_id, key, outcome: "completed" |
"failed", result, error}``. The router finds the open wait for the correlation id, activates
the waiting task's actor and delivers it; ack after the actor committed. A confirmation
nobody waits for (unknown, or already resolved) is dead-lettered, never applied twice.
Confirmations must be signed by a key with the ``confirmer`` role in the tenant.
"""

from __future__ import annotations

from typing import Any

import structlog
from nats.aio.msg import Msg

from ratchet.actors.transport.bus import redelivery_delay
from ratchet.protocol.auth import Principal
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import STREAM_EXTERNAL, dlq_subject, tenant_of
from ratchet.supervisors.services.routing import Target, TaskRouter, deliveries

__all__ = ["ExternalRouter", "EARLY_RETRIES"]

#: How many deliveries a confirmation gets while no wait for it is open (backing off
#: 0.5 s, 1 s, 2 s, ...), before it is dead-lettered.
EARLY_RETRIES = 5


class ExternalRouter(TaskRouter):
    stream = STREAM_EXTERNAL
    durable = "external-router"
    filter_subject = "ratchet.external.>"
    expects = MessageType.EXTERNAL_RESOLVED
    signed_service = "external"
    log = structlog.get_logger("ratchet.external")

    async def target(self, msg: Msg, env: Envelope, who: Principal | None) -> Target | None:
        tenant = tenant_of(msg.subject)
        cid = env.body.get("correlation_id")
        if not isinstance(cid, str) or not cid:
            raise InvalidMessage("external.resolved needs a correlation_id")
        wait = await self.store.find_wait(tenant, cid)
        if wait is None:
            if deliveries(msg) < EARLY_RETRIES:
                # A webhook may overtake the 202 that makes the task record its wait.
                await msg.nak(delay=redelivery_delay(msg))
                return None
            raise InvalidMessage("no open wait for this correlation id",
                                 correlation_id=cid, tenant=tenant)
        task_id, kind = wait
        body = dict(env.body)
        body["wait_kind"] = kind
        if kind.startswith("action:"):
            body.setdefault("key", kind.removeprefix("action:"))
        return Target(task_id, env.model_copy(update={"body": body}))

    def dead_letters(self, msg: Msg) -> str:
        return dlq_subject("external", tenant_of(msg.subject))

    def delivered(self, target: Target, outcome: Any) -> None:
        self.log.info("confirmation delivered", task_id=target.task_id, outcome=outcome,
                      correlation_id=target.envelope.body.get("correlation_id"))
