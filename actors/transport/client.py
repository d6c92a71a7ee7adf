"""A client for producers, subscribers and tools: submit, get, watch.

Everything here is the documented wire protocol (docs/protocol.md); a producer in another
language does the same with a NATS client and msgpack.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from pydantic import BaseModel

from ratchet.actors.transport.event_feed import EventFeed, Refusals
from ratchet.protocol.auth import Signer, inbox_prefix
from ratchet.protocol.catalogue import EventType, MessageType, admin_type
from ratchet.protocol.codec import decode_map, encode
from ratchet.protocol.errors import RemoteError, Unauthenticated
from ratchet.protocol.events import decode_event
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.messages import (
    ApprovalDecision,
    Budget,
    Envelope,
    Event,
    GetTask,
    Reply,
    SubmitTask,
    TaskSnapshot,
)
from ratchet.protocol.redaction import reveal
from ratchet.protocol.subjects import (
    api_subject,
    decision_subject,
    submit_subject,
    task_events_filter,
)

__all__ = ["Client", "TERMINAL_EVENTS"]

log = structlog.get_logger("ratchet.client")

TERMINAL_EVENTS = frozenset({EventType.TASK_SUCCEEDED, EventType.TASK_FAILED,
                             EventType.TASK_CANCELLED})


def _refused(exc: BaseException) -> bool:
    """Whether NATS refused the connection's credentials (nats-py reports it as an
    AuthorizationError, or at connect as the server's ``Authorization Violation``)."""
    return isinstance(exc, nats.errors.AuthorizationError) \
        or "authorization violation" in str(exc).lower()


class Client:
    def __init__(self, nc: NATS, tenant: str = "default", signer: Signer | None = None,
                 refusals: Refusals | None = None) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.tenant = tenant
        self.signer = signer
        #: The server's permissions violations on this connection (fed by connect's
        #: error callback; None for a connection made elsewhere).
        self.refusals = refusals

    @classmethod
    async def connect(cls, url: str, tenant: str = "default",
                      creds: Path | str | Signer | None = None) -> Client:
        """``creds``: a key file (``SU…`` seed, e.g. from ``ratchet creds``) or a Signer.
        It authenticates the connection (NATS nkey auth) and signs every request; replies
        come under the key's own inbox (docs/security.md). Without it only unsigned
        operations work (JetStream submits where NATS allows them)."""
        signer = creds if isinstance(creds, Signer) or creds is None else Signer.from_file(creds)
        options: dict[str, Any] = {}
        if signer is not None:
            options = {"nkeys_seed_str": signer.seed.decode(),
                       "inbox_prefix": inbox_prefix(signer.public_key)}
        nc = NATS()
        closing: set[asyncio.Task[None]] = set()
        connected = False
        refusals = Refusals()

        async def on_error(exc: Exception) -> None:
            log.warning("nats error", error=str(exc) or type(exc).__name__)
            refusals.report(exc)
            if not _refused(exc):
                return
            # A key the server refuses (unknown, revoked) stays refused: stop trying instead
            # of retrying for minutes. At connect nats-py reads this option right after
            # calling us; a reconnect (the server dropped a revoked key) is closed outright,
            # from a task of its own since close() cancels the reconnect loop calling us.
            nc.options["allow_reconnect"] = False
            if connected:
                task = asyncio.get_running_loop().create_task(nc.close())
                closing.add(task)
                task.add_done_callback(closing.discard)

        try:
            await nc.connect(url, name="ratchet-client", error_cb=on_error, **options)
            connected = True
        except nats.errors.Error as exc:
            if not _refused(exc):
                raise
            raise Unauthenticated("the NATS server refused the connection: no key, or a key"
                                  " it does not know (docs/security.md)",
                                  key=signer.public_key if signer else None) from None
        return cls(nc, tenant, signer, refusals)

    async def close(self) -> None:
        await self.nc.drain()

    def _envelope(self, type_: str, body: dict[str, Any], reply_to: str | None = None) -> Envelope:
        mid = new_id("msg")
        return Envelope(type=type_, message_id=mid, correlation_id=mid, reply_to=reply_to,
                        body=body)

    async def submit(self, workflow: str, input: dict[str, Any] | BaseModel, key: str, *,
                     version: int | None = None, deadline_s: float | None = None,
                     budget: dict[str, Any] | None = None, priority: int = 0) -> str:
        """Publish a task request on JetStream; returns the task id (known up front).
        ``priority``: 0 to 9, higher admitted first within the tenant's share.

        ``input``: a map, or the workflow's ``input_model`` instance. Its secrets
        (``SecretStr``) travel in clear to the node, which seals them: use TLS to NATS.
        """
        body = SubmitTask(workflow=workflow, workflow_version=version, input=reveal(input),
                          idempotency_key=key, deadline_s=deadline_s, priority=priority,
                          budget=Budget.model_validate(budget) if budget else None)
        env = self._envelope(MessageType.TASK_SUBMIT, body.model_dump())
        await self.js.publish(submit_subject(self.tenant), encode(env),
                              headers={"Nats-Msg-Id": f"{self.tenant}:{key}"})
        return task_id_for(self.tenant, key)

    def sign(self, subject: str, data: bytes) -> dict[str, str]:
        """The signature headers of a request (none without credentials)."""
        return self.signer.headers(subject, data, time.time()) if self.signer else {}

    async def publish_signed(self, subject: str, data: bytes) -> None:
        """A signed JetStream publish: decisions and external confirmations."""
        await self.js.publish(subject, data, headers=self.sign(subject, data) or None)

    async def decide(self, task_id: str, approval_id: str, decision: str,
                     reason: str | None = None) -> None:
        """Approve or reject on ``ratchet.decisions.<tenant>`` (needs the approver role)."""
        body = ApprovalDecision(task_id=task_id, approval_id=approval_id,
                                decision=decision, reason=reason)  # type: ignore[arg-type]
        env = self._envelope(MessageType.APPROVAL_DECISION, body.model_dump())
        await self.publish_signed(decision_subject(self.tenant), encode(env))

    async def request(self, verb: str, type_: str, body: dict[str, Any],
                      timeout: float = 10.0, subject: str | None = None) -> dict[str, Any]:
        env = self._envelope(type_, body)
        subject = subject or api_subject(self.tenant, verb)
        data = encode(env)
        msg = await self.nc.request(subject, data, timeout=timeout,
                                    headers=self.sign(subject, data) or None)
        reply = Reply.model_validate(decode_map(msg.data))
        if not reply.ok:
            err = reply.error
            assert err is not None
            raise RemoteError(err.code, err.message, err.retryable, err.details)
        return reply.result or {}

    async def submit_sync(self, workflow: str, input: dict[str, Any] | BaseModel, key: str, *,
                          version: int | None = None, priority: int = 0) -> dict[str, Any]:
        """Validated synchronous accept over request/reply; raises RemoteError
        (RATE_LIMITED among others: ``details.retry_after``)."""
        body = SubmitTask(workflow=workflow, workflow_version=version, input=reveal(input),
                          idempotency_key=key, priority=priority)
        return await self.request("submit", MessageType.TASK_SUBMIT, body.model_dump())

    async def request_admin(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """An admin command (``body`` is an AdminCommand); raises RemoteError on errors."""
        return await self.request(verb, admin_type(verb), body,
                                  subject=f"ratchet.admin.{self.tenant}.{verb}")

    async def get(self, task_id: str) -> TaskSnapshot:
        result = await self.request("get", MessageType.TASK_GET,
                                    GetTask(task_id=task_id).model_dump())
        return TaskSnapshot.model_validate(result)

    async def watch(self, task_id: str, after: int = 0, *, follow_terminal: bool = False,
                    idle_timeout: float | None = None) -> AsyncIterator[Event]:
        """Yield the task's events in sequence order, from ``after + 1``, live.

        Stops after a terminal event unless ``follow_terminal``; repeats are skipped by
        sequence. ``idle_timeout`` bounds the wait for each next event.
        """
        feed = EventFeed(self.nc, task_events_filter(self.tenant, task_id), self.refusals)
        last = after
        try:
            while True:
                msg = await asyncio.wait_for(feed.next(), idle_timeout) \
                    if idle_timeout else await feed.next()
                event = decode_event(msg.data)
                if event.sequence <= last:
                    continue
                last = event.sequence
                yield event
                if event.type in TERMINAL_EVENTS and not follow_terminal:
                    return
        finally:
            await feed.close()
