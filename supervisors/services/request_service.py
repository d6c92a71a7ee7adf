"""Request/reply services on core NATS (queue groups): the API and the admin service.

Each request runs in its own task (subscription callbacks run one at a time), bounded by
``max_in_flight``. Every answer is a :class:`Reply`: ``{ok: true, result}`` or ``{ok: false,
error: {code, message, retryable, details}}``, with the request's correlation id (salvaged
from the raw map when the envelope does not validate). An invalid tenant or verb token is
INVALID_ARGUMENT. One bad request never stops the service.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import MaxPayloadError
from opentelemetry.trace import SpanKind

from ratchet.actors.core.actor import ServiceActor
from ratchet.actors.transport.bus import Bus
from ratchet.actors.transport.subscribed import subscriptions_registered
from ratchet.protocol import tracing
from ratchet.protocol.auth import Principal
from ratchet.protocol.codec import decode_envelope, encode, reply_route
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.mail_seal import is_sealed_subject
from ratchet.protocol.messages import Envelope, Reply
from ratchet.protocol.subjects import check_token, request_route
from ratchet.supervisors.services.authn import Authenticator, may_reply

__all__ = ["Forwarded", "Ready", "RequestService", "error_reply"]

log = structlog.get_logger("ratchet.requests")


def error_reply(exc: RatchetError, correlation_id: str | None) -> Reply:
    return Reply(ok=False, correlation_id=correlation_id, error=exc.to_wire())  # type: ignore[arg-type]


def _correlation_id(env: Envelope | None, msg: Msg) -> str | None:
    """The request's correlation id: the envelope's, or salvaged from a raw map that did
    not validate (None if there is none to read)."""
    return env.correlation_id if env is not None else reply_route(msg.data)[1]


class Forwarded(Exception):
    """Raised by :meth:`RequestService.answer` when it passed the request on to another
    node, which answers the requester directly: no reply from here.

    A control signal, not an error (so not in ``protocol/errors.py``): nothing failed, and
    ``_handle`` catches it and sends nothing."""


@dataclass(slots=True)
class Ready:
    """Ask it of a request service: answered once its subscription is live."""


class RequestService(ServiceActor):
    """Subclasses set ``subject``/``queue`` and implement :meth:`answer`."""

    subject = ""
    queue = ""
    _sub: Subscription | None = None
    _direct: Subscription | None = None

    def direct_subject(self) -> str | None:
        """A subject this node alone answers on (no queue group): forwarded requests."""
        return None

    def __init__(self, bus: Bus, authn: Authenticator, max_in_flight: int = 256) -> None:
        self.bus = bus
        self.authn = authn
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def service(self) -> str:
        return self.subject.split(".")[1]  # ratchet.<service>.*.*

    async def answer(self, tenant: str, verb: str, env: Envelope, msg: Msg,
                     who: Principal) -> dict[str, Any]:
        """The ``result`` of a request by ``who`` (verified: it acts in ``tenant`` and
        holds the verb's role); raise a RatchetError for a typed error reply."""
        raise NotImplementedError

    async def on_error(self, msg: Msg, tenant: str, exc: RatchetError) -> None:
        """Called with every typed error (e.g. to dead-letter malformed requests)."""

    async def on_start(self) -> None:
        # Subscribed (and the server told) before the actor takes mail, so an answered
        # :class:`Ready` means requests have a responder.
        self._sub = await self.bus.nc.subscribe(self.subject, queue=self.queue,
                                                cb=self._on_msg)
        direct = self.direct_subject()
        if direct is not None:
            self._direct = await self.bus.nc.subscribe(direct, cb=self._on_msg)
        await subscriptions_registered(self.bus.nc)
        await super().on_start()

    async def handle(self, message: Any) -> Any:
        if isinstance(message, Ready):
            return True
        return await super().handle(message)

    async def serve(self) -> None:
        await asyncio.Event().wait()  # requests arrive on the subscription's callback

    async def on_stop(self) -> None:
        await super().on_stop()
        for sub in (self._sub, self._direct):
            if sub is not None:
                await sub.unsubscribe()
        self._sub = self._direct = None
        for task in list(self._tasks):
            task.cancel()

    async def _on_msg(self, msg: Msg) -> None:
        await self._slots.acquire()
        # A request's span is a child of its sender's (the traceparent header), if tracing.
        task = asyncio.get_running_loop().create_task(tracing.traced(
            self._handle(msg), f"ratchet.{self.service}", msg.headers, msg.subject,
            kind=SpanKind.SERVER))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _handle(self, msg: Msg) -> None:
        # ratchet.<service>.<tenant>.<verb>, or ratchet.node.<id>.<service>.<tenant>.<verb>
        tenant, verb = request_route(msg.subject)
        env: Envelope | None = None
        who: Principal | None = None
        try:
            check_token(tenant, "tenant")
            check_token(verb, "verb")
            if is_sealed_subject(msg.subject):  # passed on by another node: sealed by it
                self.authn.check_sealed(msg)
            who = await self.authn.check(msg, self.service, tenant, verb)
            if not may_reply(msg.reply, who):
                # Only to the signer's own inbox: never on another tenant's or the
                # runtime's subjects (a confused deputy). Not done, not answered.
                log.warning("request refused: reply subject outside the signer's inbox",
                            subject=msg.subject, reply=msg.reply, principal=who.name)
                return
            env = decode_envelope(msg.data)
            result = await self.answer(tenant, verb, env, msg, who)
            reply = Reply(ok=True, correlation_id=env.correlation_id, result=result)
        except Forwarded:
            return
        except RatchetError as exc:
            await self.on_error(msg, tenant, exc)
            reply = error_reply(exc, _correlation_id(env, msg))
        except Exception as exc:  # never let one request stop the service
            # Core NATS: nothing is redelivered; the requester gets INTERNAL and may retry.
            log.error("request failed", subject=msg.subject, error=repr(exc))
            reply = error_reply(RatchetError(f"internal error: {type(exc).__name__}"),
                                _correlation_id(env, msg))
        if may_reply(msg.reply, who):
            try:
                await msg.respond(encode(reply))
            except MaxPayloadError:
                too_big = RatchetError("the answer is larger than NATS can carry; ask for less"
                                       " (e.g. history with a smaller limit)")
                await msg.respond(encode(error_reply(too_big, reply.correlation_id)))
            except Exception as exc:
                log.warning("reply failed", subject=msg.subject, error=repr(exc))
