"""subscriptions_registered: the server has read a SUB before the call returns.

A real nats-server behind the test TCP proxy, which records what the client sent, in the
order the server read it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from ratchet.actors.transport.subscribed import subscriptions_registered
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.testing.tcp_proxy import TcpProxy

PING = b"PING\r\n"


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[tuple[NATS, TcpProxy]]:
    server = EmbeddedNats(tmp_path / "nats")
    url = await server.start()
    port = int(url.rsplit(":", 1)[1])
    proxy = TcpProxy(("127.0.0.1", port), record=True)
    host, proxy_port = proxy.start()
    nc = await nats.connect(f"nats://{host}:{proxy_port}", allow_reconnect=False)
    try:
        yield nc, proxy
    finally:
        await nc.close()
        proxy.close()
        await server.stop()


def _ping_after(sent: bytes, command: bytes) -> bool:
    at = sent.find(command)
    assert at >= 0, sent
    return sent.find(PING, at) > at


async def test_a_subscription_is_read_by_the_server_before_the_call_returns(
        proxied: tuple[NATS, TcpProxy]) -> None:
    nc, proxy = proxied
    await nc.subscribe("probe.one", queue="q", cb=_nothing)
    await subscriptions_registered(nc)
    # The PONG that ended the call answered a PING the server read after the SUB.
    assert _ping_after(bytes(proxy.sent), b"SUB probe.one q")


async def test_nats_py_flush_alone_sends_its_ping_ahead_of_a_queued_sub(
        proxied: tuple[NATS, TcpProxy]) -> None:
    """Why the helper exists: if this starts failing, nats-py orders flush's PING behind
    its queue, and ``nc.flush()`` alone would do."""
    nc, proxy = proxied
    before = len(proxy.sent)
    await nc.subscribe("probe.two", cb=_nothing)
    await nc.flush()
    sent = bytes(proxy.sent[before:])
    ping, sub = sent.find(PING), sent.find(b"SUB probe.two")  # sub: -1 if not relayed yet
    assert ping >= 0 and (sub == -1 or ping < sub), sent


async def _nothing(msg: object) -> None:
    del msg
