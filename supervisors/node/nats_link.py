"""How a node reaches NATS: the configured server, another node's embedded server of the
same state dir, or an embedded server of its own; then the bus and its streams.

``cfg.nats_url`` may name several servers (a cluster, comma-separated): the node connects
to any and fails over to the others. The streams get ``cfg.nats_replicas`` copies.

The first connection is bounded (``NodeConfig.nats_connect_timeout``, ``serve
--nats-connect-timeout``): an unreachable server refuses the start with ``StartRefused``
(NATS_UNREACHABLE, "cannot reach NATS at …") instead of retrying for ever. Whatever fails
or is cancelled on the way (a signal while connecting) stops the embedded server this
node started, so a refused start leaves no server behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from ratchet.actors.transport.bus import Bus, stream_configs
from ratchet.persistence.ports import KeyringStore
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
            await bus.ensure_streams(stream_configs(cfg.streams, cfg.nats_replicas))
        except BaseException:
            await bus.close()
            raise
    except BaseException:  # refused, failed or cancelled: no server of ours left running
        if started is not None:
            await started.stop()
        raise
    return bus
