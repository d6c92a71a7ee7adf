"""A tool worker holding a ``tool_worker`` key (protocol/nats_permissions.py) against a
real node whose embedded NATS runs with the users of its keyring: it serves its tenant's
tools, and the server refuses it everything else — another tenant's requests and replies,
creating consumers (which could aim deliveries anywhere), reading requests off the
subjects without a consumer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.errors import NoRespondersError

import ratchet
from ratchet.protocol.auth import Signer
from ratchet.protocol.subjects import tool_durable, tool_ping_subject, tool_stream
from tests import tool_apps
from tests.conftest import secured_node
from tests.keys import Secured, Spy, issued


@pytest.fixture
async def secured_tools(tmp_path: Path) -> AsyncIterator[Secured]:
    """A secured node (as conftest's ``secured``) whose workflows call remote tools."""
    async with secured_node(tmp_path, tool_apps.app) as serving:
        yield serving


def _worker(url: str, key: Signer) -> ratchet.ToolWorker:
    return ratchet.ToolWorker(url, tool_apps.worker_tools[:1], "acme",
                              connect_options={"nkeys_seed_str": key.seed.decode()})


async def test_a_tool_worker_key_serves_its_tenants_tools(secured_tools: Secured) -> None:
    secured = secured_tools
    key = await issued(secured.admin, "w", "acme", ["tool_worker"])
    client = secured.as_tenant("acme")
    # The node creates the tenant's stream and the tool's consumer before its request: the
    # worker, which may not create them, binds to them.
    handle = await client.submit("remote.echo", {"text": "fenced"}, key="fenced-1")
    async with _worker(secured.url, key) as worker:
        output = await handle.result(timeout=30)
        assert worker.served == 1
    assert output["text"] == "fenced"
    assert secured.node.bus is not None
    info = await secured.node.bus.js.stream_info(tool_stream("acme"))
    assert info.state.messages == 0  # acked through $JS.ACK.RATCHET_TOOLS_acme.…: deleted


async def test_a_tool_worker_key_reaches_no_other_tenants_tools_nor_makes_consumers(
        secured_tools: Secured) -> None:
    secured = secured_tools
    spy = await Spy.connect(secured.url, await issued(secured.admin, "w", "acme",
                                                      ["tool_worker"]))
    others = tool_stream("globex")
    try:
        for subject in (
                f"$JS.API.CONSUMER.MSG.NEXT.{others}.{tool_durable('globex', 'echo')}",
                f"$JS.ACK.{others}.{tool_durable('globex', 'echo')}.1.1.1.1.0",
                f"$JS.API.STREAM.INFO.{others}", "ratchet.toolreply.globex.n1-abc",
                f"$JS.API.CONSUMER.CREATE.{tool_stream('acme')}.w.ratchet.tools.acme.echo",
                f"$JS.API.CONSUMER.DURABLE.CREATE.{tool_stream('acme')}.w",
                f"$JS.API.STREAM.CREATE.{tool_stream('acme')}",
                f"$JS.API.STREAM.DELETE.{tool_stream('acme')}",
                "ratchet.tools.acme.echo", "ratchet.dlq.mail.acme"):
            await spy.nc.publish(subject, b"{}", reply=spy.nc.new_inbox())
            await spy.refused(subject)
        for subject in ("ratchet.tools.acme.>", "ratchet.toolreply.acme.>"):
            await spy.nc.subscribe(subject)
            await spy.refused(subject)
    finally:
        await spy.close()


async def test_a_tool_worker_key_answers_the_liveness_probes_of_its_pinned_sessions(
        secured_tools: Secured) -> None:
    secured = secured_tools
    key = await issued(secured.admin, "w", "acme", ["tool_worker"])
    assert secured.node.bus is not None
    nc = secured.node.bus.nc
    worker = ratchet.ToolWorker(secured.url, tool_apps.pinned_tools, "acme",
                                connect_options={"nkeys_seed_str": key.seed.decode()})
    async with worker:
        # Its answer reaches the node's own inbox: allow_responses, no publish grant. Asked
        # again on "no responders", as the node's probe does: the server reloads its users
        # (the grant, and each lease tick) while the worker's subscription arrives.
        pong = None
        for pause in (0.1, 0.4, 1.0, None):
            try:
                pong = await nc.request(tool_ping_subject("acme", worker.worker_id), b"",
                                        timeout=10)
                break
            except NoRespondersError:
                if pause is None:
                    raise
                await asyncio.sleep(pause)  # the probe's pacing, bounded: 1.5 s in all
        assert pong is not None and pong.data == b""
    with pytest.raises(NoRespondersError):  # stopped: nobody listens there any more
        await nc.request(tool_ping_subject("acme", worker.worker_id), b"", timeout=10)
