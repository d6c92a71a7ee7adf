"""Tools served by worker processes over JetStream (issue 19, first increment): a real
nats-server, a real node, real worker processes (Python here; Node.js in
test_remote_tools_node.py), the finance simulator for effects."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

import ratchet
from ratchet.actors.transport.tool_queues import tool_stream_config
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import ToolInvalidArgument
from ratchet.protocol.subjects import tool_durable, tool_reply_subject, tool_stream, tool_subject
from ratchet.protocol.tool_wire import decode_request
from ratchet.testing import FinanceClient
from tests import tool_apps
from tests.conftest import ROOT, NodeFactory

RATCHET_BIN = Path(sys.executable).with_name("ratchet")


class WorkerProcess:
    """``ratchet tool-worker`` serving tests/tool_apps.py's tools for tenant acme."""

    def __init__(self, nats_url: str, env: dict[str, str], ack_wait: float,
                 app: str = "tests.tool_apps:worker_tools", *extra: str) -> None:
        self.proc = subprocess.Popen(
            [str(RATCHET_BIN), "--log-level", "warning", "tool-worker", "--app",
             app, "--nats-url", nats_url, "--tenant", "acme",
             "--ack-wait", str(ack_wait), *extra],
            cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=None)

    async def ready(self, timeout: float = 30.0) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        assert line, "the tool worker exited before serving"
        info: dict[str, object] = json.loads(line)
        return info

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def worker_process() -> Iterator[Callable[..., WorkerProcess]]:
    procs: list[WorkerProcess] = []

    def factory(nats_url: str, env: dict[str, str] | None = None,
                ack_wait: float = 2.0, app: str = "tests.tool_apps:worker_tools") -> WorkerProcess:
        p = WorkerProcess(nats_url, env or {}, ack_wait, app)
        procs.append(p)
        return p

    yield factory
    for p in procs:
        p.stop()


@pytest.mark.slow
async def test_a_workflow_calls_a_tool_served_by_a_worker_in_another_process(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client,
        worker_process: Callable[..., WorkerProcess]) -> None:
    await start_node(tool_apps.app)
    worker = worker_process(nats_url)
    info = await worker.ready()
    assert info["serving"] == ["echo", "pay"]

    handle = await client.submit("remote.echo", {"text": "hello"}, key="echo-1")
    output = await handle.result(timeout=30)

    assert output == {"text": "hello", "pid": worker.proc.pid}


@pytest.mark.slow
async def test_a_worker_killed_after_the_effect_and_before_its_reply_is_reconciled_by_query(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
        simulator: ratchet.testing.FinanceSimulatorProcess,
        worker_process: Callable[..., WorkerProcess]) -> None:
    await start_node(tool_apps.app)
    env = {"RATCHET_FINANCE_URL": simulator.url}
    # Redelivery (ack_wait) later than the call's timeout (3 s): the node queries first.
    dying = worker_process(nats_url, {**env, "RATCHET_TOOL_DIE_AFTER_EFFECT": "1"},
                           ack_wait=20.0)
    await dying.ready()

    handle = await client.submit("remote.pay", {"invoice": "inv-7"}, key="pay-7")
    # The worker dies by its own SIGKILL once the simulator committed the claim.
    assert await asyncio.wait_for(asyncio.to_thread(dying.proc.wait), 30) == -signal.SIGKILL
    assert finance.effects() == {"invoice:inv-7:pay": 1}
    # A healthy worker answers the node's query (and the redelivered call, a replay).
    await worker_process(nats_url, env).ready()

    output = await handle.result(timeout=60)

    assert output["provider_id"].startswith("clm")
    assert finance.effects() == {"invoice:inv-7:pay": 1}  # effective once
    types = [e.type for e in await _events(client, handle.task_id)]
    assert "action.unknown" in types and "action.reconciled" in types, types


@pytest.mark.slow
async def test_a_worker_killed_after_the_effect_is_answered_for_by_the_redelivery_a_replay(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
        simulator: ratchet.testing.FinanceSimulatorProcess,
        worker_process: Callable[..., WorkerProcess]) -> None:
    await start_node(tool_apps.app)
    env, app = {"RATCHET_FINANCE_URL": simulator.url}, "tests.tool_apps:patient_tools"
    # Redelivery (ack_wait 1 s) well within the call's timeout (30 s): the next worker's
    # call, under the same key, is a replay at the provider and the node's answer.
    dying = worker_process(nats_url, {**env, "RATCHET_TOOL_DIE_AFTER_EFFECT": "1"},
                           ack_wait=1.0, app=app)
    await dying.ready()

    handle = await client.submit("remote.pay_patient", {}, key="pay-patient")
    assert await asyncio.wait_for(asyncio.to_thread(dying.proc.wait), 30) == -signal.SIGKILL
    assert finance.effects() == {"invoice:patient:pay": 1}
    await worker_process(nats_url, env, app=app).ready()

    output = await handle.result(timeout=60)

    assert output["provider_id"].startswith("clm")
    assert finance.effects() == {"invoice:patient:pay": 1}  # effective once
    types = [e.type for e in await _events(client, handle.task_id)]
    assert "action.unknown" not in types and "action.succeeded" in types, types


async def test_malformed_forged_and_late_replies_do_not_break_the_node(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client) -> None:
    node = await start_node(tool_apps.app)
    # This test is the worker: a raw JetStream consumer, as one in any language would be.
    js = client.nc.jetstream()
    await js.add_stream(tool_stream_config("acme"))
    await js.add_consumer(tool_stream("acme"), ConsumerConfig(
        durable_name=tool_durable("acme", "echo"), filter_subject=tool_subject("acme", "echo"),
        ack_policy=AckPolicy.EXPLICIT))
    sub = await js.pull_subscribe_bind(tool_durable("acme", "echo"), stream=tool_stream("acme"))
    handle = await client.submit("remote.echo", {"text": "hi"}, key="echo-forged")
    [msg] = await sub.fetch(1, timeout=30)
    request = decode_request(msg.data)
    assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == f"read:{request.correlation_id}"
    good = {"schema_version": 1, "correlation_id": request.correlation_id,
            "idempotency_key": None, "ok": True, "result": {"text": "right", "pid": 1}}
    hostile = [b"\xc1not msgpack", b"\x00" * 900_000, encode([1, 2, 3]),
               encode({**good, "correlation_id": "tcl_forged"}),  # no such call
               encode({**good, "idempotency_key": "someone:else"}),  # the key differs
               encode({**good, "ok": "yes"}),  # not a reply
               encode({**good, "extra": "field"})]
    for data in hostile:
        await client.nc.publish(request.reply_to, data)
    # The right reply on another tenant's subject of the same inbox.
    await client.nc.publish(tool_reply_subject("other", node.tool_calls.remote.inbox), encode(
        {**good, "result": {"text": "wrong tenant", "pid": 2}}))
    await client.nc.publish(request.reply_to, encode(good))
    await msg.ack()

    assert await handle.result(timeout=30) == {"text": "right", "pid": 1}
    assert node.tool_calls.dropped == len(hostile) + 1
    await client.nc.publish(request.reply_to, encode(good))  # late: its call is settled
    second = await client.submit("remote.echo", {"text": "again"}, key="echo-again")
    [msg] = await sub.fetch(1, timeout=30)
    again = decode_request(msg.data)
    await client.nc.publish(again.reply_to, encode(
        {**good, "correlation_id": again.correlation_id, "result": {"text": "ok", "pid": 3}}))
    await msg.ack()
    assert await second.result(timeout=30) == {"text": "ok", "pid": 3}
    assert node.tool_calls.dropped == len(hostile) + 2


async def test_a_slow_tool_holds_up_only_its_own_requests_and_failures_keep_their_class(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(tool_apps.app)
    release = asyncio.Event()

    async def slow(ctx: ratchet.ToolContext, args: tool_apps.EchoArgs) -> tool_apps.EchoResult:
        await release.wait()
        return tool_apps.EchoResult(text="slow", pid=0)

    def refuse(ctx: ratchet.ToolContext, args: tool_apps.PayArgs) -> tool_apps.PayResult:
        raise ToolInvalidArgument("no such invoice")

    tools = [ratchet.served_by(tool_apps.slow, slow), ratchet.served_by(tool_apps.refuse, refuse),
             *tool_apps.worker_tools]
    # The default ack_wait (30 s): "quick" shares its partition with a "slow" task, whose
    # step waits on its tool; the mail router no longer holds "quick"'s start behind it
    # (tests/test_mail_head_of_line.py).
    async with ratchet.ToolWorker(nats_url, tools, "acme", max_in_flight=1) as worker:
        stuck = [await client.submit("remote.slow", {}, key=f"slow-{i}") for i in range(2)]
        quick = await client.submit("remote.echo", {"text": "quick"}, key="quick")
        assert (await quick.result(timeout=30))["text"] == "quick"  # not behind slow
        with pytest.raises(ratchet.TaskFailed) as failed:
            await (await client.submit("remote.refuse", {}, key="refused")).result(timeout=30)
        assert "remote INVALID_ARGUMENT" in str(failed.value.error), failed.value.error
        release.set()
        for handle in stuck:
            assert (await handle.result(timeout=30))["text"] == "slow"
        assert worker.dead_lettered == 0


async def _events(client: ratchet.Client, task_id: str) -> list[ratchet.Event]:
    return [e async for e in client.watch(task_id, idle_timeout=5)]
