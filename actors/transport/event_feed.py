"""Following a task's events as a tenant's subscriber may (docs/security.md): an ordered
push consumer on RATCHET_EVENTS, created by the client itself.

NATS lets a subscriber create consumers only through
``$JS.API.CONSUMER.CREATE.RATCHET_EVENTS.<name>.<filter>`` with its tenant's filter (the
server checks the config's filter is the subject's), and deliver only under its own inbox.
nats-py's ordered consumer cannot be used as is: it looks the stream up
(``$JS.API.STREAM.NAMES``, which a tenant may not call) and re-creates its consumer under the
same name after a gap, which the server refuses as a changed config. So this is the same
protocol, done here:

- one consumer per pass: ephemeral, in memory, ack none, flow control and heartbeats;
  the server removes it by itself once nobody listens (a tenant may not delete consumers);
- flow-control requests (and a stalled heartbeat's ``Nats-Consumer-Stalled`` subject) are
  answered at once, so the server keeps sending;
- a gap in the consumer sequence (messages dropped on the way) or two missed heartbeats
  (a server restart lost the consumer) start a new consumer after the last stream sequence
  seen: nothing is skipped, and a repeat is the caller's to ignore by event sequence;
- ``new_only`` starts at the messages stored after the first consumer exists (a filter as
  wide as a tenant's: awaiting many tasks' results with one consumer), and a new consumer
  after the stream's last message at that time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import ServiceUnavailableError

from ratchet.protocol.errors import PermissionDenied
from ratchet.protocol.ids import new_id
from ratchet.protocol.subjects import STREAM_EVENTS

__all__ = ["EventFeed", "Refusals"]

#: Seconds between the server's idle heartbeats; two missed mean the consumer is gone.
HEARTBEAT_S = 2.0
#: Seconds before a consumer nobody listens to is removed by the server.
INACTIVE_S = 30.0
#: Pause between attempts to create a consumer while the server is away (pacing: the
#: caller's own timeout bounds the whole wait).
_RETRY_S = 0.5
_STALLED = "Nats-Consumer-Stalled"


def _within(subject: str, pattern: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest (one token or more)."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or token not in ("*", got[i]):
            return False
    return len(want) == len(got)


def _honour_cancellation() -> None:
    """Raise CancelledError if this task was asked to stop. nats-py's ``next_msg`` returns a
    message (a heartbeat) that arrived as it was cancelled, and the cancellation is lost
    (``asyncio.wait_for`` in Python 3.11): without this, a caller's timeout falling on a
    heartbeat waited for the next event, for ever if none came."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Refusals:
    """The permissions violations a connection's server reports (fed by its error
    callback), for a request to stop waiting on: the server drops a request it refuses
    and says so at once, while nats-py would only time the request out."""

    def __init__(self) -> None:
        self._waiting: dict[asyncio.Future[str], str] = {}
        #: The server refused the connection's key (its ``Authorization Violation``
        #: may come through the callback while the attempt fails with a hang-up).
        self.credentials_refused = False

    def report(self, error: BaseException) -> None:
        text = str(error).lower()
        if "authorization violation" in text:
            self.credentials_refused = True
        if "permissions violation" not in text:
            return
        for fut, fragment in list(self._waiting.items()):
            if fragment in text and not fut.done():
                fut.set_result(text)

    def watch(self, subject_prefix: str) -> asyncio.Future[str]:
        """Resolved when a publish under ``subject_prefix`` is refused; :meth:`forget` it."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[fut] = f'"{subject_prefix.lower()}'
        return fut

    def forget(self, fut: asyncio.Future[str]) -> None:
        self._waiting.pop(fut, None)
        fut.cancel()


class EventFeed:
    """The messages of ``filter_subject`` in RATCHET_EVENTS (or ``stream``: RATCHET_SANDBOX
    for a sandbox fork's), in stream order, live.

    ``refusals``: the connection's (Client's) report of permissions violations, so that a
    key without the right to follow these events is told at once rather than in 5 s."""

    def __init__(self, nc: NATS, filter_subject: str, refusals: Refusals | None = None, *,
                 new_only: bool = False, stream: str = STREAM_EVENTS) -> None:
        self.nc = nc
        self.stream = stream
        self.js = nc.jetstream()
        self.filter_subject = filter_subject
        self.refusals = refusals
        self._sub: Subscription | None = None
        self._stream_seq = 0  # the last stream sequence delivered
        self._consumer_seq = 0  # the last consumer sequence of the current consumer
        #: Only messages stored after the first consumer exists (no history): for a
        #: filter as wide as a tenant's, whose history may be long.
        self._new_only = new_only
        #: How many stored messages the first consumer found to deliver (None before it
        #: exists): 0 means the stream holds nothing under the filter yet.
        self.backlog: int | None = None

    async def _open(self) -> None:
        await self.close()
        deliver = self.nc.new_inbox()  # under the client's own inbox prefix
        after, name = self._stream_seq, new_id("watch")
        first_new = self._new_only and self.backlog is None
        policy = DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL
        config = ConsumerConfig(
            name=name, filter_subject=self.filter_subject,
            deliver_subject=deliver, ack_policy=AckPolicy.NONE, max_deliver=1,
            flow_control=True, idle_heartbeat=HEARTBEAT_S, inactive_threshold=INACTIVE_S,
            mem_storage=True, num_replicas=1,
            deliver_policy=DeliverPolicy.NEW if first_new else policy,
            opt_start_seq=after + 1 if after and not first_new else None)
        # Subscribed first: the consumer starts delivering as soon as it exists.
        self._sub = await self.nc.subscribe(deliver)
        self._consumer_seq = 0
        # Name and filter set: nats-py uses CONSUMER.CREATE.<stream>.<name>.<filter>.
        create = asyncio.ensure_future(self.js.add_consumer(self.stream, config))
        if self.refusals is None:
            self._created(await create)
            return
        refused = self.refusals.watch(f"$JS.API.CONSUMER.CREATE.{self.stream}.{name}.")
        try:
            either: set[asyncio.Future[Any]] = {create, refused}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:  # refused, or this wait cancelled: the request is not waited for
            self.refusals.forget(refused)
            answered = create.done()
            if not answered:
                create.cancel()
        if not answered:
            raise self._denied()
        self._created(create.result())

    def _created(self, info: ConsumerInfo) -> None:
        if self.backlog is not None:
            return
        self.backlog = info.num_pending or 0
        if self._new_only and info.delivered is not None:
            # A consumer made anew (a gap, a lost consumer) resumes after the stream's last
            # message when this one started, so nothing stored since is skipped.
            self._stream_seq = info.delivered.stream_seq or 0

    async def _reopen(self) -> None:
        while True:
            before = self.nc.last_error
            try:
                await self._open()
                return
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                    nats.errors.ConnectionReconnectingError, ServiceUnavailableError):
                self._refused(before)
                await asyncio.sleep(_RETRY_S)  # the server is restarting: try again

    def _refused(self, before: BaseException | None) -> None:
        """A request the server dropped for lack of permission times out like one to a
        server that is away; the server's error says which, so it is not retried."""
        error = self.nc.last_error
        if error is not before and "permissions violation" in str(error).lower():
            raise self._denied()

    def _denied(self) -> PermissionDenied:
        return PermissionDenied("NATS refused to create the consumer: this key may not"
                                " follow these events", filter=self.filter_subject)

    async def start(self) -> None:
        """Make the consumer now, if it does not exist yet: from here on, every message
        stored under the filter is delivered (the caller bounds the wait)."""
        if self._sub is None:
            await self._reopen()

    async def next(self) -> Msg:
        """The next event message (waits as long as it takes; the caller bounds it)."""
        while True:
            _honour_cancellation()
            if self._sub is None:
                await self._reopen()
            assert self._sub is not None
            try:
                msg = await self._sub.next_msg(timeout=2 * HEARTBEAT_S + 1)
            except nats.errors.TimeoutError:
                await self.close()  # no heartbeat: the consumer is gone
                continue
            if await self._take(msg):
                return msg

    async def buffered(self) -> Msg | None:
        """The next event message if one has arrived already, else None (at once).

        ``next`` pays nats-py's ``next_msg`` — a task and a timer per message — which for
        a burst of a hundred events was most of a follower's time; a message that has
        arrived is taken without either."""
        while self._sub is not None:
            queue = self._sub._pending_queue
            if queue.empty():
                return None
            msg = queue.get_nowait()
            self._sub._pending_size -= len(msg.data)  # as ``next_msg`` accounts for it
            queue.task_done()
            if await self._take(msg):
                return msg
        return None

    async def _take(self, msg: Msg) -> bool:
        """Whether ``msg`` is the next event (else it was a heartbeat, flow control, a
        foreign message or a gap, dealt with here)."""
        headers = msg.headers or {}
        if headers.get("Status") == "100":  # a heartbeat or a flow-control request
            reply = msg.reply or headers.get(_STALLED)
            if reply:
                await self.nc.publish(reply)
            return False
        if not _within(msg.subject, self.filter_subject):
            # Another key's consumer update could redirect foreign events here (it would
            # have to guess the consumer's random name): never yield them.
            return False
        meta = msg.metadata
        if meta.sequence.consumer != self._consumer_seq + 1:
            await self.close()  # a gap: start again after the last one seen
            return False
        self._consumer_seq = meta.sequence.consumer
        self._stream_seq = meta.sequence.stream
        return True

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:  # the connection is closing anyway
                pass
