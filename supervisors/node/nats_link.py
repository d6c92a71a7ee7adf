"""How a node reaches NATS: the configured server, another node's embedded server of the
same state dir, or an embedded server of its own; then the bus and its streams.

``cfg.nats_url`` may name several servers (a cluster, comma-separated): the node connects
to any and fails over to the others. The streams get ``cfg.nats_replicas`` copies.

The first connection is bounded (``NodeConfig.nats_connect_timeout``, ``serve
--nats-connect-timeout``): an unreachable server refuses the start with ``StartRefused``
(NATS_UNREACHABLE, "cannot reach NATS at …") instead of retrying for ever; so is the
creation of the streams, which a JetStream cluster electing its leaders does not answer
for a moment. Whatever fails
or is cancelled on the way (a signal while connecting) stops the embedded server this
node started, so a refused start leaves no server behind.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import ServiceUnavailableError

from ratchet.actors.transport.bus import Bus, stream_configs
from ratchet.persistence.ports import KeyringStore
from ratchet.protocol.auth import redact_url
from ratchet.protocol.errors import ErrorCode, StartRefused
from ratchet.supervisors.node.config import NodeConfig
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.supervisors.node.nats_auth import NatsAuthorization, nats_auth_options

__all__ = ["NatsLink", "link_nats"]

log = structlog.get_logger("ratchet.node")


@dataclass
class NatsLink:
    """A node's way to NATS, once connected."""

    url: str
    bus: Bus
    #: The node key's public half (the embedded server's users give it every permission).
    node_key: str
    #: The embedded server's users (None on an external NATS): nats_auth.py.
    auth: NatsAuthorization | None
    #: The embedded server this node started (it stops it), or None.
    embedded: EmbeddedNats | None
    #: The embedded server it uses, its own or another node's (reloaded after key changes).
    server: EmbeddedNats | None


async def link_nats(cfg: NodeConfig, store: KeyringStore) -> NatsLink:
    """Join the configured NATS or another node's embedded server, or start one (with the
    keyring's users); connect, bounded; create the streams.

    Raises:
        StartRefused: NATS_UNREACHABLE, no connection within ``cfg.nats_connect_timeout``;
            NATS_PORT_TAKEN, ``cfg.nats_port`` is taken by another process.
    """
    state_dir = Path(cfg.state_dir)
    auth = NatsAuthorization(state_dir, store)
    node_key = auth.node.public_key
    if cfg.nats_url:
        options = nats_auth_options(cfg.nats_creds) if cfg.nats_creds else {}
        bus = await _connect(cfg, cfg.nats_url, options, None)
        return NatsLink(cfg.nats_url, bus, node_key, auth=None, embedded=None, server=None)
    server = EmbeddedNats(state_dir / "nats", config_file=auth.path, port=cfg.nats_port)
    if (running := server.live_url()) is not None:
        # Another node of this state dir runs the embedded server: join it (it stops with
        # that node — several nodes belong on a standalone NATS).
        log.info("joining the embedded nats-server of another node", url=running)
        await auth.refresh(server)
        bus = await _connect(cfg, running, auth.connect_options(), None)
        return NatsLink(running, bus, node_key, auth=auth, embedded=None, server=server)
    await auth.write()
    url = await server.start()
    bus = await _connect(cfg, url, auth.connect_options(), server)
    return NatsLink(url, bus, node_key, auth=auth, embedded=server, server=server)


async def _connect(cfg: NodeConfig, url: str, options: dict[str, Any],
                   started: EmbeddedNats | None) -> Bus:
    """The bus on ``url`` with its streams; on any failure or cancel, the server this node
    ``started`` is stopped again."""
    try:
        bus = await Bus.connect(url, name=cfg.node_id, auth=options,
                                give_up_after=cfg.nats_connect_timeout)
        try:
            await _ensure_streams(bus, cfg, url)
        except BaseException:
            await bus.close()
            raise
    except BaseException:  # refused, failed or cancelled: no server of ours left running
        if started is not None:
            await started.stop()
        raise
    return bus


async def _ensure_streams(bus: Bus, cfg: NodeConfig, url: str) -> None:
    """The streams, created or brought to the config. A JetStream cluster that lost a
    server answers nothing (a timeout, 503) while it elects leaders, for a second or so:
    asked again until ``cfg.nats_connect_timeout``.

    Raises:
        StartRefused: NATS_UNREACHABLE, JetStream did not answer within the bound.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.nats_connect_timeout
    while True:
        try:
            await bus.ensure_streams(stream_configs(cfg.streams, cfg.nats_replicas))
            return
        except (TimeoutError, NatsTimeoutError, ServiceUnavailableError) as exc:
            if loop.time() >= deadline:
                shown = redact_url(url)
                raise StartRefused(ErrorCode.NATS_UNREACHABLE,
                                   f"JetStream at {shown} did not answer within"
                                   f" {cfg.nats_connect_timeout:g} s ({exc!r})",
                                   url=shown, seconds=cfg.nats_connect_timeout) from None
            log.warning("jetstream did not answer; asking again", error=repr(exc))
            await asyncio.sleep(0.25)  # pacing against NATS, under the deadline
