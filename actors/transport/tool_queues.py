"""Remote tools' queues on JetStream: one work-queue stream per tenant, one durable pull
consumer per (tenant, tool) in it (docs/protocol.md, "Serving a tool from another process
or language").

Why a stream per tenant, not one stream for every tenant's tools: NATS permissions are
subject patterns whose wildcards stand for whole tokens, and what a worker must be allowed
to publish to pull and ack requests — ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>``
and ``$JS.ACK.<stream>.<consumer>.…`` — names no subject, only the stream and the
consumer. With one shared stream a tenant's worker could be scoped only by listing each
of its consumers by name (so each tool, known at grant time); with ``RATCHET_TOOLS_<tenant>``
the stream token is the tenant, and ``…MSG.NEXT.RATCHET_TOOLS_acme.*`` is exactly acme's
tools, every one of them (protocol/nats_permissions.py, role ``tool_worker``). A tenant's
queue limits are its own as a bonus: one tenant's unserved tool cannot fill the others'.

Who creates what: a node creates a tenant's stream, and the tool's consumer, before its
first request of that tool (once per process: :class:`ToolQueues`); a worker with the
permission may create them too (a node key or a hand-written user), so the first of them
sets the consumer's ``ack_wait`` and ``max_deliver`` and later ones bind to it as it is. A
``tool_worker`` principal may create neither: a consumer's config could name a push
``deliver_subject``, which would make the server publish the tenant's requests wherever the
worker says.

The streams replace the shared ``RATCHET_TOOLS`` (``ratchet.tools.>``) of the first
release; its subjects overlap every tenant's, so a node that finds it deletes it (the
requests it held are unanswered calls, which the ledger reconciles).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from ratchet.actors.transport.bus import StreamLimits
from ratchet.protocol.subjects import (
    LEGACY_STREAM_TOOLS,
    tool_durable,
    tool_pinned_durable,
    tool_pinned_subject,
    tool_stream,
    tool_stream_subjects,
    tool_subject,
)

__all__ = ["ToolQueues", "tool_consumer_config", "tool_stream_config"]

log = structlog.get_logger("ratchet.tool_queues")

#: A pinned consumer nobody pulled from for this long is removed by the server.
_PINNED_IDLE_S = 24 * 3600.0
#: JetStream's error code for a stream whose subjects overlap another stream's.
_SUBJECTS_OVERLAP = 10065


def tool_stream_config(tenant: str, limits: StreamLimits | None = None,
                       replicas: int = 1) -> StreamConfig:
    """``RATCHET_TOOLS_<tenant>``: a work queue of ``ratchet.tools.<tenant>.>``, file
    storage, at most ``tools_max_msgs`` / ``tools_max_bytes`` (new requests refused)."""
    lim = limits or StreamLimits()
    return StreamConfig(
        name=tool_stream(tenant), subjects=[tool_stream_subjects(tenant)],
        retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
        discard=DiscardPolicy.NEW, duplicate_window=120.0, num_replicas=replicas,
        max_msgs=lim.tools_max_msgs, max_bytes=lim.tools_max_bytes)


def tool_consumer_config(tenant: str, tool: str, ack_wait: float = 30.0,
                         max_deliver: int = 5, worker: str | None = None) -> ConsumerConfig:
    """The consumer every worker of ``tool`` for ``tenant`` shares; with ``worker``, the one
    of that worker's pinned sessions (removed by the server after a day unused: a worker
    that went away for good)."""
    if worker is None:
        return ConsumerConfig(
            durable_name=tool_durable(tenant, tool), filter_subject=tool_subject(tenant, tool),
            ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait, max_deliver=max_deliver,
            max_ack_pending=10_000)
    return ConsumerConfig(
        durable_name=tool_pinned_durable(tenant, tool, worker),
        filter_subject=tool_pinned_subject(tenant, tool, worker),
        ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait, max_deliver=max_deliver,
        max_ack_pending=10_000, inactive_threshold=_PINNED_IDLE_S)


class ToolQueues:
    """Makes sure a tenant's tool stream and a tool's consumer exist: asked before each
    request, it talks to JetStream only the first time for each (tenant, tool) of this
    process, or after :meth:`forget` (a publish that found no stream)."""

    def __init__(self, js: JetStreamContext, limits: StreamLimits | None = None,
                 replicas: int = 1) -> None:
        self.js = js
        self.limits = limits or StreamLimits()
        self.replicas = replicas
        self._ready: set[tuple[str, str, str | None]] = set()
        self._lock = asyncio.Lock()

    async def ensure(self, tenant: str, tool: str, worker: str | None = None) -> None:
        """Create the stream and the consumer (``worker``'s pinned one, with a worker) if
        missing; an existing consumer keeps its settings."""
        if (tenant, tool, worker) in self._ready:
            return
        async with self._lock:
            if (tenant, tool, worker) in self._ready:
                return
            await ensure_stream(self.js, tool_stream_config(tenant, self.limits, self.replicas))
            await ensure_consumer(self.js, tenant,
                                  tool_consumer_config(tenant, tool, worker=worker))
            if len(self._ready) >= 10_000:  # pinned workers come and go: stay bounded
                self._ready.clear()
            self._ready.add((tenant, tool, worker))

    def forget(self, tenant: str) -> None:
        """The tenant's stream was not there after all: look again next time."""
        self._ready = {k for k in self._ready if k[0] != tenant}


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create the stream unless it exists (an existing one is left as it is). Deletes the
    first release's shared stream if it is in the way."""
    assert config.name is not None
    try:
        await js.stream_info(config.name)
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        if exc.err_code != _SUBJECTS_OVERLAP:
            # Another node or worker created it meanwhile (same config): fine.
            with contextlib.suppress(NotFoundError):
                await js.stream_info(config.name)
                return
            raise
        log.warning("deleting the former shared tool stream: its subjects overlap the"
                    " per-tenant ones", stream=LEGACY_STREAM_TOOLS)
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(LEGACY_STREAM_TOOLS)
        with contextlib.suppress(BadRequestError):  # made meanwhile by another
            await js.add_stream(config)


async def ensure_consumer(js: JetStreamContext, tenant: str, config: ConsumerConfig) -> None:
    """Create the consumer unless it exists: the first creator's settings stand (an
    ``add_consumer`` would update them under the workers already serving)."""
    assert config.durable_name is not None
    stream = tool_stream(tenant)
    try:
        await js.consumer_info(stream, config.durable_name)
    except NotFoundError:
        with contextlib.suppress(BadRequestError):  # another made it meanwhile
            await js.add_consumer(stream, config)
