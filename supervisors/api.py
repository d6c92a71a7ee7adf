"""Request/reply API on ``ratchet.api.<tenant>.<verb>`` (core NATS, queue group).

Verbs: ``submit`` (a validated, synchronous accept: same semantics as the JetStream
intake) and ``get`` (the task snapshot). Every answer is a :class:`Reply`; malformed
requests get an INVALID_ARGUMENT reply and are dead-lettered.
"""

from __future__ import annotations

import asyncio

import structlog
from nats.aio.msg import Msg

from actors.bus import Bus
from actors.core import ServiceActor
from persistence.store import Store
from protocol.codec import decode_envelope, encode, parse_body
from protocol.errors import InvalidMessage, RatchetError
from protocol.messages import Envelope, GetTask, Reply
from supervisors.intake import Acceptor, error_reply

__all__ = ["ApiActor"]

log = structlog.get_logger("ratchet.api")


class ApiActor(ServiceActor):
    def __init__(self, bus: Bus, acceptor: Acceptor, store: Store, max_in_flight: int = 256) -> None:
        self.bus = bus
        self.acceptor = acceptor
        self.store = store
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        sub = await self.bus.nc.subscribe("ratchet.api.*.*", queue="ratchet-api", cb=self._on_msg)
        try:
            await asyncio.Event().wait()
        finally:
            await sub.unsubscribe()
            for task in list(self._tasks):
                task.cancel()

    async def _on_msg(self, msg: Msg) -> None:
        # Callbacks run one at a time per subscription; hand each request to its own task.
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(self._handle(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _handle(self, msg: Msg) -> None:
        _, _, tenant, verb = msg.subject.split(".", 3)
        env: Envelope | None = None
        try:
            env = decode_envelope(msg.data)
            if verb == "submit":
                accepted = await self.acceptor.accept(tenant, env)
                reply = Reply(ok=True, correlation_id=env.correlation_id, result=accepted.model_dump())
            elif verb == "get":
                body = parse_body(env, GetTask)
                snap = await self.store.snapshot(tenant, body.task_id)
                reply = Reply(ok=True, correlation_id=env.correlation_id, result=snap.model_dump())
            else:
                raise InvalidMessage(f"unknown verb {verb!r}", verb=verb)
        except RatchetError as exc:
            if isinstance(exc, InvalidMessage):
                try:
                    await self.acceptor.dead_letter(msg.subject, msg.data, exc, tenant)
                except Exception as store_exc:
                    log.error("dead-letter failed", error=repr(store_exc))
            reply = error_reply(exc, env.correlation_id if env else None)
        except Exception as exc:  # never let one request stop the service
            log.error("api request failed", verb=verb, error=repr(exc))
            reply = error_reply(RatchetError(f"internal error: {type(exc).__name__}"),
                                env.correlation_id if env else None)
        if msg.reply:
            try:
                await msg.respond(encode(reply))
            except Exception as exc:
                log.warning("api reply failed", error=repr(exc))
