"""JetStream publishes with acks, for a publisher that sends many at once (the outbox relay).

nats-py's ``publish_async`` pays, per message, a task (``wait_for`` around its stall
semaphore), an OS random token, two callbacks and a ``PubAck`` object; for a burst of a
hundred events that was most of the relay's time on the loop, and each message's task let
the burst spread over many loop iterations, delaying everything else the loop ran (a
fan-out's join, a task's next commit). Here a message costs a counter, a future and the
publish itself: the burst goes out in one iteration, and each ack is matched by its reply
subject under one wildcard subscription (on the connection's inbox prefix, as nats-py's).

An ack is what ``publish_async`` would make of it: an error reply fails the future with
nats-py's ``APIError``, a 503 status with ``NoStreamResponseError``. A future given up on
(cancelled, as ``wait_for`` does on a timeout) is forgotten; a late ack for it is dropped.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

__all__ = ["JsAcks"]

_NO_RESPONDERS = "503"


class JsAcks:
    """Publishes to JetStream on ``nc`` and resolves each message's future with its ack."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._next = 0

    async def publish(self, subject: str, payload: bytes,
                      headers: dict[str, str] | None = None) -> asyncio.Future[dict[str, Any]]:
        """Send one message; the future resolves with its ack (the stream's answer, a
        dict) or fails as ``publish_async``'s would. Raises what ``nc.publish`` raises
        (e.g. ``MaxPayloadError``), nothing being sent then."""
        if self._sub is None:
            self._prefix = self.nc.new_inbox() + "."
            self._sub = await self.nc.subscribe(self._prefix + "*", cb=self._on_ack)
        self._next += 1
        token = str(self._next)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[token] = fut
        fut.add_done_callback(lambda _: self._waiting.pop(token, None))
        try:
            await self.nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
        except BaseException:
            fut.cancel()
            raise
        return fut

    async def _on_ack(self, msg: Msg) -> None:
        fut = self._waiting.get(msg.subject[len(self._prefix):])
        if fut is None or fut.done():
            return  # given up on, or a repeat
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            fut.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            reply = json.loads(msg.data)
        except ValueError as exc:
            fut.set_exception(exc)
            return
        if "error" in reply:
            fut.set_exception(nats.js.errors.APIError.from_error(reply["error"]))
        else:
            fut.set_result(reply)

    async def close(self) -> None:
        """Drop the ack subscription; futures still waiting are cancelled."""
        sub, self._sub = self._sub, None
        for fut in list(self._waiting.values()):
            fut.cancel()
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:  # the connection is closing anyway
                pass
