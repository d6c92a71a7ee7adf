"""Request/reply API on ``ratchet.api.<tenant>.<verb>``: ``submit`` (a validated,
synchronous accept: same semantics as the JetStream intake) and ``get`` (the snapshot).
Malformed requests get an INVALID_ARGUMENT reply and are dead-lettered."""

from __future__ import annotations

from typing import Any

import structlog
from nats.aio.msg import Msg

from ratchet.actors.transport.bus import Bus
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.auth import Principal
from ratchet.protocol.codec import parse_body
from ratchet.protocol.errors import InvalidMessage, RatchetError
from ratchet.protocol.messages import Envelope, GetTask
from ratchet.supervisors.services.authn import Authenticator
from ratchet.supervisors.services.intake import Acceptor
from ratchet.supervisors.services.request_service import RequestService

__all__ = ["ApiActor"]

log = structlog.get_logger("ratchet.api")


class ApiActor(RequestService):
    subject = "ratchet.api.*.*"
    queue = "ratchet-api"

    def __init__(self, bus: Bus, authn: Authenticator, acceptor: Acceptor, store: TaskStore,
                 max_in_flight: int = 256) -> None:
        super().__init__(bus, authn, max_in_flight)
        self.acceptor = acceptor
        self.store = store

    async def answer(self, tenant: str, verb: str, env: Envelope, msg: Msg,
                     who: Principal) -> dict[str, Any]:
        if verb == "submit":
            return (await self.acceptor.accept(tenant, env)).model_dump()
        if verb == "get":
            body = parse_body(env, GetTask)
            return (await self.store.snapshot(tenant, body.task_id)).model_dump()
        raise InvalidMessage(f"unknown verb {verb!r}", verb=verb)

    async def on_error(self, msg: Msg, tenant: str, exc: RatchetError) -> None:
        if isinstance(exc, InvalidMessage):
            try:
                await self.acceptor.dead_letter(msg.subject, msg.data, exc, tenant, msg.headers)
            except Exception as store_exc:
                log.error("dead-letter failed", error=repr(store_exc))
