"""A client for producers, subscribers and tools: submit (a :class:`TaskHandle` to await),
results of many tasks, get, watch.

Everything here is the documented wire protocol (docs/protocol.md); a producer in another
language does the same with a NATS client and msgpack.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from pydantic import BaseModel

from ratchet.actors.transport.connection import open_connection
from ratchet.actors.transport.event_feed import EventFeed, Refusals
from ratchet.actors.transport.event_watch import GAP_TIMEOUT_S, follow
from ratchet.actors.transport.handles import TaskHandle, TaskOutcome, await_outcomes
from ratchet.actors.transport.local_nodes import discover_creds
from ratchet.actors.transport.servers import NatsServers
from ratchet.protocol.auth import Signer, inbox_prefix
from ratchet.protocol.catalogue import MessageType, admin_type
from ratchet.protocol.codec import decode_map, encode
from ratchet.protocol.errors import (
    ErrorCode,
    NotFound,
    RemoteError,
    Unavailable,
)
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.messages import (
    ApprovalDecision,
    Budget,
    Envelope,
    Event,
    GetTask,
    Reply,
    SubmitTask,
    TaskAccepted,
    TaskSnapshot,
)
from ratchet.protocol.redaction import reveal
from ratchet.protocol.subjects import (
    STREAM_SANDBOX,
    api_subject,
    decision_subject,
    sandbox_events_filter,
    submit_subject,
    task_events_filter,
)
from ratchet.protocol.task_outcomes import TERMINAL_EVENTS
from ratchet.protocol.tracing import outbound_headers

__all__ = ["CONNECT_TIMEOUT_S", "Client", "TERMINAL_EVENTS"]

log = structlog.get_logger("ratchet.client")

#: Seconds ``Client.connect`` keeps trying to reach NATS before it raises NatsUnreachable:
#: a server restarting is back within it, an address nobody serves fails within it.
CONNECT_TIMEOUT_S = 5.0
#: How long ``watch`` asks the node whether a task without events exists.
_GET_TIMEOUT_S = 5.0


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
    async def connect(cls, url: NatsServers, tenant: str = "default",
                      creds: Path | str | Signer | None = None, *,
                      connect_timeout: float = CONNECT_TIMEOUT_S) -> Client:
        """``url``: a server, or several (comma-separated or a list: a cluster; any one
        that answers will do, and a lost one is replaced by another once connected).
        ``creds``: a key file (``SU…`` seed, e.g. from ``ratchet creds``) or a Signer.
        It authenticates the connection (NATS nkey auth) and signs every request; replies
        come under the key's own inbox (docs/security.md). Without it, ``$RATCHET_CREDS``;
        else, for a loopback URL, the key a local node registered for its embedded server
        (local_nodes.py: same OS user only); else only unsigned operations work.

        Raises:
            NatsUnreachable: no server answered at ``url`` within ``connect_timeout``
                seconds (default 5); its message is ``cannot reach NATS at <url>``.
            Unauthenticated: the server refused the key.
        """
        if creds is None:  # $RATCHET_CREDS, or the key of a local node's embedded server
            creds = discover_creds(url)
        signer = creds if isinstance(creds, Signer) or creds is None else Signer.from_file(creds)
        options: dict[str, Any] = {}
        if signer is not None:
            options = {"nkeys_seed_str": signer.seed.decode(),
                       "inbox_prefix": inbox_prefix(signer.public_key)}
        nc, refusals = await open_connection(
            url, signer.public_key if signer else None, options, connect_timeout)
        return cls(nc, tenant, signer, refusals)

    async def close(self) -> None:
        """Drain the connection and close it. One that is reconnecting (its server was
        lost) has nothing to drain through: it is closed at once, not left raising."""
        if self.nc.is_connecting or self.nc.is_reconnecting:
            await self.nc.close()
            return
        await self.nc.drain()

    def _envelope(self, type_: str, body: dict[str, Any], reply_to: str | None = None) -> Envelope:
        mid = new_id("msg")
        return Envelope(type=type_, message_id=mid, correlation_id=mid, reply_to=reply_to,
                        body=body)

    async def submit(self, workflow: str, input: dict[str, Any] | BaseModel, key: str, *,
                     version: int | None = None, deadline_s: float | None = None,
                     budget: dict[str, Any] | None = None, priority: int = 0,
                     traceparent: str | None = None) -> TaskHandle:
        """Publish a task request on JetStream (fire and forget); returns the task's handle,
        whose id is known up front. ``await handle.result()`` awaits its outcome.
        ``priority``: 0 to 9, higher admitted first within the tenant's share.
        ``traceparent``: the W3C trace the task's spans continue; by default the caller's
        current OpenTelemetry span, if any (docs/protocol.md, Traces).

        Nothing confirms acceptance: a request the node refuses (an unknown workflow, an
        invalid input) is dead-lettered and never becomes a task. :meth:`submit_sync`
        is validated by the node before it returns.

        ``input``: a map, or the workflow's ``input_model`` instance. Its secrets
        (``SecretStr``) travel in clear to the node, which seals them: use TLS to NATS.
        """
        body = self._submission(workflow, input, key, version, deadline_s, budget, priority)
        env = self._envelope(MessageType.TASK_SUBMIT, body.model_dump())
        await self.js.publish(submit_subject(self.tenant), encode(env), headers=outbound_headers(
            {"Nats-Msg-Id": f"{self.tenant}:{key}"}, traceparent))
        return self.handle(task_id_for(self.tenant, key), key)

    async def submit_sync(self, workflow: str, input: dict[str, Any] | BaseModel, key: str, *,
                          version: int | None = None, deadline_s: float | None = None,
                          budget: dict[str, Any] | None = None,
                          priority: int = 0, traceparent: str | None = None) -> TaskHandle:
        """Submit over request/reply: the node validates and accepts (or finds the task
        this key made before) before it answers; ``handle.accepted`` holds its answer.
        ``traceparent``: as for :meth:`submit`.

        Raises:
            RemoteError: refused — ``INVALID_ARGUMENT`` (unknown workflow, invalid input),
                ``CONFLICT`` (the key was used with another request), ``UNAVAILABLE``.
        """
        body = self._submission(workflow, input, key, version, deadline_s, budget, priority)
        result = await self.request("submit", MessageType.TASK_SUBMIT, body.model_dump(),
                                    traceparent=traceparent)
        accepted = TaskAccepted.model_validate(result)
        return TaskHandle(accepted.task_id, self.tenant, key, self, accepted)

    def handle(self, task_id: str, key: str | None = None) -> TaskHandle:
        """The handle of a task of this tenant submitted earlier (by id)."""
        return TaskHandle(task_id, self.tenant, key, self)

    def results(self, handles: Iterable[TaskHandle], timeout: float | None = None,
                ) -> AsyncGenerator[TaskOutcome, None]:
        """Each task's outcome as it ends, over ONE subscription, whatever their number::

            async for outcome in client.results(handles, timeout=60):
                if outcome.ok: print(outcome.handle.task_id, outcome.output)
                else: print(outcome.error.code, outcome.error.message)

        A failed task does not stop the iteration (``outcome.error`` holds its
        TaskFailed, TaskCancelled or TaskHandedOff; ``outcome.result()`` raises it).
        Needs the roles producer (``get``) and subscriber (events). Leaving the loop early,
        wrap it in ``contextlib.aclosing`` to drop the subscription at once.

        Raises:
            ResultTimeout: ``timeout`` seconds passed before every task ended (those
                yielded stand; ``pending`` names the rest).
        """
        return await_outcomes(self, handles, timeout)

    @staticmethod
    def _submission(workflow: str, input: dict[str, Any] | BaseModel, key: str,
                    version: int | None, deadline_s: float | None,
                    budget: dict[str, Any] | None, priority: int = 0) -> SubmitTask:
        return SubmitTask(workflow=workflow, workflow_version=version, input=reveal(input),
                          idempotency_key=key, deadline_s=deadline_s, priority=priority,
                          budget=Budget.model_validate(budget) if budget else None)

    def sign(self, subject: str, data: bytes) -> dict[str, str]:
        """The signature headers of a request (none without credentials)."""
        return self.signer.headers(subject, data, time.time()) if self.signer else {}

    async def publish_signed(self, subject: str, data: bytes) -> None:
        """A signed JetStream publish: decisions and external confirmations (in the
        caller's trace, if it has one)."""
        await self.js.publish(subject, data,
                              headers=outbound_headers(self.sign(subject, data)) or None)

    async def decide(self, task_id: str, approval_id: str, decision: str,
                     reason: str | None = None) -> None:
        """Approve or reject on ``ratchet.decisions.<tenant>`` (needs the approver role)."""
        body = ApprovalDecision(task_id=task_id, approval_id=approval_id,
                                decision=decision, reason=reason)  # type: ignore[arg-type]
        env = self._envelope(MessageType.APPROVAL_DECISION, body.model_dump())
        await self.publish_signed(decision_subject(self.tenant), encode(env))

    async def request(self, verb: str, type_: str, body: dict[str, Any],
                      timeout: float = 10.0, subject: str | None = None,
                      traceparent: str | None = None) -> dict[str, Any]:
        """One signed request, in the caller's trace (or ``traceparent``'s); its error reply
        raised as RemoteError.

        Raises:
            Unavailable: no node answered (none serves the subject, or not within
                ``timeout`` seconds; a key NATS does not let publish there looks the same).
        """
        env = self._envelope(type_, body)
        subject = subject or api_subject(self.tenant, verb)
        data = encode(env)
        headers = outbound_headers(self.sign(subject, data), traceparent) or None
        try:
            msg = await self._ask(subject, data, timeout, headers)
        except nats.errors.NoRespondersError:
            raise Unavailable(f"no node serves {subject}", subject=subject) from None
        except nats.errors.TimeoutError:
            raise Unavailable(f"no answer on {subject} within {timeout:g} s", subject=subject,
                              timeout_s=timeout) from None
        reply = Reply.model_validate(decode_map(msg.data))
        if not reply.ok:
            err = reply.error
            assert err is not None
            raise RemoteError(err.code, err.message, err.retryable, err.details)
        return reply.result or {}

    async def _ask(self, subject: str, data: bytes, timeout: float,
                   headers: dict[str, str] | None) -> Any:
        """``nc.request``, asked again (after 0.05, 0.1, 0.2 s) when the server says no one
        serves the subject: a node that has just started or is rebalancing may not be seen
        yet (nobody received the request, so asking again cannot do it twice)."""
        for delay in (0.05, 0.1, 0.2, None):
            try:
                return await self.nc.request(subject, data, timeout=timeout, headers=headers)
            except nats.errors.NoRespondersError:
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def request_admin(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """An admin command (``body`` is an AdminCommand); raises RemoteError on errors."""
        return await self.request(verb, admin_type(verb), body,
                                  subject=f"ratchet.admin.{self.tenant}.{verb}")

    async def get(self, task_id: str, timeout: float = 10.0) -> TaskSnapshot:
        result = await self.request("get", MessageType.TASK_GET,
                                    GetTask(task_id=task_id).model_dump(), timeout=timeout)
        return TaskSnapshot.model_validate(result)

    async def watch(self, task_id: str, after: int = 0, *, follow_terminal: bool = False,
                    idle_timeout: float | None = None,
                    missing_after: float | None = None,
                    sandbox: bool = False,
                    gap_timeout: float = GAP_TIMEOUT_S) -> AsyncIterator[Event]:
        """Yield the task's events in sequence order, from ``after + 1``, live; a sandbox
        fork's with ``sandbox`` (they are on ``ratchet.sandbox.events.…`` only).

        Stops after a terminal event unless ``follow_terminal``; repeats are skipped by
        sequence. ``idle_timeout`` bounds the wait for each next event.

        Events published out of order (a fan-out's branches on several nodes: each node's
        relay publishes its own) are held until the earlier ones come; a sequence missing
        for ``gap_timeout`` seconds is read from the store (admin ``history``, role
        viewer), else skipped with a logged warning (actors/transport/event_watch.py).

        ``missing_after``: when the stream holds no event of the task and the node knows
        no such task, wait this many seconds more (a JetStream submit may still be on its
        way), then raise NotFound instead of waiting for ever.
        """
        feed = EventFeed(self.nc, sandbox_events_filter(self.tenant, task_id), self.refusals,
                         stream=STREAM_SANDBOX) if sandbox else \
            EventFeed(self.nc, task_events_filter(self.tenant, task_id), self.refusals)

        def not_found(known: bool | None) -> NotFound:
            unasked = "" if known is False else "; the node did not answer a get"
            return NotFound(f"no such task: {task_id} (tenant {self.tenant}){unasked}",
                            task_id=task_id, tenant=self.tenant)

        try:
            known = True if missing_after is None else await self._known(feed, task_id)
            async with aclosing(follow(
                    feed, task_id, after, follow_terminal=follow_terminal,
                    idle_timeout=idle_timeout, history=self.history, gap_timeout=gap_timeout,
                    known=known, missing_after=missing_after, not_found=not_found)) as events:
                async for event in events:
                    yield event
        finally:
            await feed.close()

    async def history(self, task_id: str, after: int = 0, limit: int = 500) -> list[Event]:
        """The task's stored events after sequence ``after`` (at most ``limit``), from the
        store through a node (admin ``history``: a key of the viewer role)."""
        reply = await self.request_admin("history", {
            "command_id": new_id("cmd"), "task_id": task_id,
            "args": {"after": after, "limit": limit}})
        return [Event.model_validate({**row, "task_id": task_id, "tenant": self.tenant,
                                      "producer": "store"})
                for row in reply.get("events", ())]

    async def _known(self, feed: EventFeed, task_id: str) -> bool | None:
        """Whether the task exists: events of it are stored, or the node knows it; None
        when the node cannot be asked (no API serving, a key without the producer role):
        then, as for False, the task's first event must come within ``missing_after``."""
        await feed.start()
        if feed.backlog:
            return True
        try:
            await self.get(task_id, timeout=_GET_TIMEOUT_S)
        except RemoteError as exc:
            if exc.code != ErrorCode.NOT_FOUND:
                raise
            return False
        except Unavailable:
            return None
        return True
