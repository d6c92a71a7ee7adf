"""The JetStream bus: connection, the streams Ratchet uses, and pull-consumer loops.

Streams are created idempotently at start (create, or update to the same config):

========================  ==========================  ==========================
stream                    subjects                    retention
========================  ==========================  ==========================
RATCHET_SUBMIT            ``ratchet.submit.>``        work queue (deleted on ack)
RATCHET_MAIL              ``ratchet.mail.>``          work queue (deleted on ack)
RATCHET_EXTERNAL          ``ratchet.external.>``      work queue (confirmations)
RATCHET_DECISIONS         ``ratchet.decisions.>``     work queue (approval decisions)
RATCHET_EVENTS            ``ratchet.events.>``        limits (max age, default 7 d)
RATCHET_DLQ               ``ratchet.dlq.>``           limits (max age, default 30 d)
RATCHET_SANDBOX           ``ratchet.sandbox.>``       limits (max age, default 1 d)
RATCHET_TOOLS_<tenant>    ``ratchet.tools.<t>.>``     work queue, made at first use
========================  ==========================  ==========================

Every stream has ``num_replicas`` copies (``serve --nats-replicas``, default 1): R3 on a
three-server cluster keeps every stream through one server's loss. An existing stream is
brought to the same config, replica count included (scaled up or down by JetStream,
logged); a count the servers cannot hold (more than the cluster's servers, or above 1 on
a server that is not clustered) refuses the start as a usage error.

JetStream is transport, the Store is the truth: a message lost by JetStream delays a task
(the node's recovery scan and the outbox relay re-derive it), it never loses one.

Streams and consumers deleted or purged under a running node (an operator's ``nats stream
rm``, a server whose store was wiped): a pull loop whose fetch finds no stream or consumer,
a publish that no stream takes, or a lookup that finds none calls :meth:`Bus.restore_streams`,
which creates every stream again (at most once a second); the loop then creates its
consumer again and goes on. What the streams held is gone; what matters of it is in the
store, and the outbox relay and the recovery sweeper re-derive it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import (
    APIError,
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)

from ratchet.actors.transport.servers import NatsServers, join_servers, server_list
from ratchet.protocol.auth import redact_url
from ratchet.protocol.errors import ErrorCode, StartRefused, UsageError
from ratchet.protocol.subjects import (
    STREAM_DECISIONS,
    STREAM_DLQ,
    STREAM_EVENTS,
    STREAM_EXTERNAL,
    STREAM_MAIL,
    STREAM_SANDBOX,
    STREAM_SUBMIT,
)

__all__ = ["Bus", "MB", "StreamLimits", "deliveries", "stream_configs", "redelivery_delay",
           "STREAM_GONE"]

log = structlog.get_logger("ratchet.bus")

DAY = 24 * 3600.0
MB = 1024 * 1024

#: What nats-py raises when a stream or consumer is not there: a lookup (404), a fetch from
#: a consumer whose stream went (503: nobody answers for it), a publish no stream takes.
STREAM_GONE = (NotFoundError, ServiceUnavailableError, NoStreamResponseError)

#: JetStream's answers to a replica count it cannot place: no suitable peers (more
#: replicas than servers), insufficient resources, replicas > 1 without a cluster.
REPLICAS_REFUSED = {10005, 10023, 10074}


@dataclass(frozen=True)
class StreamLimits:
    """What each JetStream stream may hold, and what happens at the limit.

    - ``events`` (``RATCHET_EVENTS``, limits retention): at ``events_max_age`` or
      ``events_max_bytes`` the *oldest* events are discarded. The store keeps every event
      (``admin history``); only live ``watch`` replays from the stream.
    - ``dlq`` (``RATCHET_DLQ``): the same, with ``dlq_max_age`` / ``dlq_max_bytes`` /
      ``dlq_max_msgs``; the store's ``dead_letters`` table keeps a row per dead letter,
      bounded on its own (persistence/dead_letter_rows.py).
    - ``sandbox`` (``RATCHET_SANDBOX``): sandbox forks' events (``ratchet.sandbox.events.>``,
      never on the production events stream), oldest dropped at ``sandbox_max_age`` or
      ``sandbox_max_bytes``; the store keeps them all, as any task's.
    - the work queues (submit, mail, external, decisions; and each tenant's tools,
      ``RATCHET_TOOLS_<tenant>``, made at its first remote call: transport/tool_queues.py) hold only what is not consumed
      yet: at ``queue_max_bytes`` a stream refuses *new* messages (the publisher gets an
      error: a producer's submit fails, the outbox relay keeps the row and retries), so a
      stalled consumer never silently loses work and never fills the disk; the tools
      queue at ``tools_max_msgs`` or ``tools_max_bytes`` (a tool nobody serves).
    """

    events_max_age: float = 7 * DAY
    events_max_bytes: int = 1024 * MB
    dlq_max_age: float = 30 * DAY
    dlq_max_bytes: int = 256 * MB
    dlq_max_msgs: int = 100_000
    queue_max_bytes: int = 1024 * MB
    sandbox_max_age: float = 1 * DAY
    sandbox_max_bytes: int = 256 * MB
    tools_max_msgs: int = 100_000  # requests waiting for a tool worker
    tools_max_bytes: int = 256 * MB


def stream_configs(limits: StreamLimits | None = None, replicas: int = 1) -> list[StreamConfig]:
    """Ratchet's streams, each with ``replicas`` copies (one per server: at most the
    cluster's size)."""
    lim = limits or StreamLimits()
    common: dict[str, Any] = {"storage": StorageType.FILE, "duplicate_window": 120.0,
                              "num_replicas": replicas}
    queue: dict[str, Any] = {"retention": RetentionPolicy.WORK_QUEUE,
                             "max_bytes": lim.queue_max_bytes, "discard": DiscardPolicy.NEW,
                             **common}
    kept: dict[str, Any] = {"retention": RetentionPolicy.LIMITS,
                            "discard": DiscardPolicy.OLD, **common}
    return [
        StreamConfig(name=STREAM_SUBMIT, subjects=["ratchet.submit.>"], **queue),
        StreamConfig(name=STREAM_MAIL, subjects=["ratchet.mail.>"], **queue),
        StreamConfig(name=STREAM_EXTERNAL, subjects=["ratchet.external.>"], **queue),
        StreamConfig(name=STREAM_DECISIONS, subjects=["ratchet.decisions.>"], **queue),
        StreamConfig(name=STREAM_EVENTS, subjects=["ratchet.events.>"],
                     max_age=lim.events_max_age, max_bytes=lim.events_max_bytes, **kept),
        StreamConfig(name=STREAM_DLQ, subjects=["ratchet.dlq.>"],
                     max_age=lim.dlq_max_age, max_bytes=lim.dlq_max_bytes,
                     max_msgs=lim.dlq_max_msgs, **kept),
        StreamConfig(name=STREAM_SANDBOX, subjects=["ratchet.sandbox.>"],
                     max_age=lim.sandbox_max_age, max_bytes=lim.sandbox_max_bytes, **kept),
    ]


def deliveries(msg: Msg) -> int:
    """How many times JetStream delivered this message (1 for a core message)."""
    try:
        return int(msg.metadata.num_delivered)
    except Exception:  # not a JetStream message
        return 1


def redelivery_delay(msg: Msg, base: float = 0.5, cap: float = 60.0) -> float:
    """Delay for a NAK: doubles with each delivery of the message, so a message that keeps
    failing (a bug, a broken store) is retried ever more slowly instead of in a hot loop."""
    return float(min(cap, base * 2 ** max(0, min(deliveries(msg) - 1, 16))))


class Bus:
    """One NATS connection and its JetStream context."""

    def __init__(self, nc: NATS, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js
        self.closing = False
        self._configs: list[StreamConfig] = []
        self._restoring = asyncio.Lock()
        self._restored_at = float("-inf")
        #: Times the streams were found missing and created again.
        self.streams_restored = 0

    @classmethod
    async def connect(cls, url: NatsServers, name: str = "ratchet",
                      auth: dict[str, Any] | None = None,
                      give_up_after: float | None = None) -> Bus:
        """``url``: one server or several (comma-separated or a list: a cluster); once
        connected, a lost server is replaced by another of them (or of those the cluster
        announced), every half second, for ever. ``auth``: ``nats.connect`` options that
        authenticate the node (its nkey seed, or a ``.creds`` file:
        supervisors/node/nats_auth.py). ``give_up_after``: seconds
        the first connection may take (None: retry for ever); once connected, a lost
        connection is retried for ever.

        Raises:
            StartRefused: NATS_UNREACHABLE, no connection within ``give_up_after``.
        """
        async def on_error(exc: Exception) -> None:
            log.warning("nats error", error=repr(exc))

        bus: Bus | None = None

        async def on_disconnect() -> None:
            if bus is not None and bus.closing:
                log.debug("nats disconnected (closing)")
            else:
                log.warning("nats disconnected")

        async def on_reconnect() -> None:
            log.info("nats reconnected")

        nc = NATS()
        connecting = nc.connect(
            server_list(url),
            name=name,
            # Notice a half-dead connection in seconds, not the default ~4 minutes.
            ping_interval=5,
            max_outstanding_pings=3,
            max_reconnect_attempts=-1,
            # Annotated int in nats-py, used as seconds to sleep: half a second works.
            reconnect_time_wait=0.5,  # type: ignore[arg-type]
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            **(auth or {}),
        )
        try:
            # nats-py retries a first connection for ever with max_reconnect_attempts=-1.
            async with asyncio.timeout(give_up_after):
                await connecting
        except BaseException as exc:  # the bound, or a cancel (a signal while starting)
            last = nc.last_error
            with contextlib.suppress(Exception):  # it never connected: nothing to flush
                await nc.close()
            if not isinstance(exc, TimeoutError):
                raise
            why = f"gave up after {give_up_after:g} s" + (f"; last error: {last!r}" if last else "")
            shown = redact_url(join_servers(url))
            raise StartRefused(ErrorCode.NATS_UNREACHABLE, f"cannot reach NATS at {shown} ({why})",
                               url=shown, seconds=give_up_after) from None
        bus = cls(nc, nc.jetstream(publish_async_max_pending=4000))
        return bus

    async def ensure_streams(self, configs: list[StreamConfig] | None = None) -> None:
        """Create each stream, or bring an existing one to the same config (its replica
        count too: JetStream scales it).

        Raises:
            UsageError: the servers cannot hold that many replicas (``--nats-replicas``).
        """
        self._configs = configs or self._configs or stream_configs()
        for cfg in self._configs:
            try:
                try:
                    await self.js.add_stream(cfg)
                except BadRequestError as exc:
                    if exc.err_code in REPLICAS_REFUSED:
                        raise
                    await self._update_stream(cfg)
            except APIError as exc:
                if exc.err_code not in REPLICAS_REFUSED:
                    raise
                raise UsageError(
                    f"--nats-replicas {cfg.num_replicas}: NATS cannot keep stream {cfg.name}"
                    f" with {cfg.num_replicas} replicas ({exc.description}); give at most the"
                    " number of servers in the JetStream cluster (1 without a cluster)",
                    replicas=cfg.num_replicas, stream=cfg.name) from None

    async def _update_stream(self, cfg: StreamConfig) -> None:
        assert cfg.name is not None  # every config of stream_configs names its stream
        before = await self.js.stream_info(cfg.name)
        if before.config.num_replicas != cfg.num_replicas:
            log.warning("changing a stream's replica count", stream=cfg.name,
                        replicas=cfg.num_replicas, was=before.config.num_replicas)
        await self.js.update_stream(cfg)

    async def restore_streams(self, error: BaseException) -> None:
        """A stream or consumer was missing (``error``): create every stream again. At most
        once a second: a caller that comes sooner waits out the rest of that second (loop
        time: this paces retries against NATS, it is no task's timer)."""
        async with self._restoring:
            now = asyncio.get_running_loop().time()
            if now - self._restored_at < 1.0:
                await asyncio.sleep(self._restored_at + 1.0 - now)
                return
            self._restored_at = now
            # On a cluster that lost a server the same errors come while a stream elects
            # its new leader: creating it again is then a no-op, and harmless.
            log.warning("jetstream stream or consumer missing (or electing a leader);"
                        " creating the streams again", error=repr(error))
            try:
                await self.ensure_streams()
            except (TimeoutError, NatsTimeoutError) as exc:  # no answer yet: the caller retries
                log.warning("jetstream did not answer; trying again", error=repr(exc))
                return
            self.streams_restored += 1

    async def ensure_consumer(self, stream: str, durable: str, filter_subject: str,
                              ack_wait: float = 30.0, max_ack_pending: int = 10_000,
                              inactive_threshold: float | None = None) -> None:
        config = ConsumerConfig(
            durable_name=durable,
            filter_subject=filter_subject,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ack_wait,
            max_ack_pending=max_ack_pending,
            inactive_threshold=inactive_threshold,
        )
        await self.js.add_consumer(stream, config)

    async def forget_consumer(self, stream: str, durable: str) -> bool:
        """Delete a durable consumer if it exists (e.g. one an older release created whose
        filter would overlap a new one's on a work-queue stream)."""
        try:
            await self.js.delete_consumer(stream, durable)
            return True
        except NotFoundError:
            return False

    async def pull_loop(
        self,
        stream: str,
        durable: str,
        filter_subject: str,
        handler: Callable[[list[Msg]], Awaitable[None]],
        *,
        batch: int = 256,
        idle_timeout: float = 1.0,
        before_fetch: Callable[[], Awaitable[Any]] | None = None,
        ack_wait: float = 30.0,
        idle_exit: float | None = None,
        inactive_threshold: float | None = None,
    ) -> None:
        """Fetch batches forever and hand each to ``handler`` (which acks).

        ``before_fetch``: awaited before each fetch — backpressure: while it waits, messages
        stay in the stream (on disk) instead of piling up in memory. ``idle_exit``: return
        after that many seconds without a message (None: never).

        An empty fetch raises ``nats.errors.TimeoutError`` by design (nats.py#418): that is
        "nothing to do", not an error.
        """
        async def bind() -> Any:
            while True:
                try:
                    await self.ensure_consumer(stream, durable, filter_subject,
                                               ack_wait=ack_wait,
                                               inactive_threshold=inactive_threshold)
                    return await self.js.pull_subscribe_bind(durable, stream=stream)
                except STREAM_GONE as exc:
                    await self.restore_streams(exc)
                except (TimeoutError, NatsTimeoutError) as exc:
                    # JetStream without a leader for a moment (a cluster that lost a
                    # server elects one): ask again shortly rather than crash the loop.
                    log.info("jetstream did not answer; binding again", stream=stream,
                             durable=durable, error=repr(exc))
                    await asyncio.sleep(0.5)

        sub = await bind()
        loop = asyncio.get_running_loop()
        last_message = loop.time()
        try:
            while True:
                if before_fetch is not None:
                    await before_fetch()
                try:
                    msgs = await sub.fetch(batch, timeout=idle_timeout)
                except STREAM_GONE as exc:  # deleted under us: create it all again, go on
                    await self.restore_streams(exc)
                    await _unsubscribe(sub)
                    sub = await bind()
                    continue
                except (TimeoutError, NatsTimeoutError):
                    if idle_exit is not None and loop.time() - last_message >= idle_exit:
                        return
                    continue
                last_message = loop.time()
                await handler(msgs)
        finally:
            await _unsubscribe(sub)

    async def close(self) -> None:
        self.closing = True
        if self.nc.is_connected or self.nc.is_reconnecting:
            try:
                await self.nc.drain()
            except Exception as exc:
                log.warning("nats drain failed", error=repr(exc))
                try:
                    await self.nc.close()
                except Exception as close_exc:  # the server is gone: nothing left to close
                    log.debug("nats close failed", error=repr(close_exc))


async def _unsubscribe(sub: Any) -> None:
    try:
        await sub.unsubscribe()
    except Exception:  # the connection may already be closing
        pass
