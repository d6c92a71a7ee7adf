"""Clustered NATS: nodes and clients take several server URLs, the streams are created
with ``--nats-replicas`` copies, a run rides out one server's SIGKILL, and mail JetStream
lost (RATCHET_MAIL purged while tasks are parked) is made good from the store.

The cluster is three real nats-servers on loopback (ratchet/testing/nats_cluster.py);
the nodes are real ``ratchet serve`` processes sharing one SQLite store, as in
tests/test_nodes.py."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import ratchet
from bench.chaos import run_chaos
from bench.steps import NodeProc
from ratchet.actors.transport.bus import Bus, stream_configs
from ratchet.actors.transport.servers import join_servers, server_list
from ratchet.protocol.subjects import DEFAULT_PARTITIONS, STREAM_MAIL
from ratchet.supervisors.cli.parser import parser
from ratchet.supervisors.cli.serve import node_config
from ratchet.supervisors.node.embedded_nats import find_nats_server
from ratchet.testing.nats_cluster import NatsCluster
from tests.apps import three
from tests.conftest import RATCHET_BIN, ROOT, NodeProcess, node_key, wait_terminal
from tests.test_streams import _approve, _parked

SAMPLE = ROOT / "docs" / "examples" / "nats-cluster.conf"
APP = "tests.cluster_apps:app"
LEASE = ("--lease-ttl", "3", "--lease-interval", "0.5")
STREAMS = [cfg.name for cfg in stream_configs()]


def test_server_lists_come_comma_separated_repeated_or_as_a_list() -> None:
    assert server_list("nats://a:4222, nats://b:4222,,") == ["nats://a:4222", "nats://b:4222"]
    assert server_list(["nats://a:4222,nats://b:4222", "nats://c:4222"]) == [
        "nats://a:4222", "nats://b:4222", "nats://c:4222"]
    assert join_servers(["nats://a:4222", "nats://b:4222"]) == "nats://a:4222,nats://b:4222"
    assert join_servers(None) is None
    with pytest.raises(ValueError, match="no NATS server"):
        server_list(" , ")
    args = parser().parse_args([
        "serve", "--app", APP, "--nats-url", "nats://a:4222,nats://b:4222",
        "--nats-url", "nats://c:4222", "--nats-replicas", "3"])
    config = node_config(args)
    assert config.nats_url == "nats://a:4222,nats://b:4222,nats://c:4222"
    assert config.nats_replicas == 3
    assert node_config(parser().parse_args(["serve", "--app", APP])).nats_replicas == 1


def test_the_sample_cluster_configuration_is_one_nats_server_takes() -> None:
    text = SAMPLE.read_text()
    assert "sync_interval" in text and "--nats-replicas 3" in text and "routes" in text
    checked = subprocess.run([find_nats_server(), "-t", "-c", str(SAMPLE)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    nats = NatsCluster(tmp_path / "cluster")
    await nats.start()
    try:
        yield nats
    finally:
        await nats.stop()


@pytest.mark.slow
async def test_a_cluster_whose_chosen_port_was_taken_starts_again_on_new_ports(
        tmp_path: Path) -> None:
    nats = NatsCluster(tmp_path / "cluster")
    taken = nats.servers[1].cluster_port
    with socket.socket() as squatter:  # what another process binding it first looks like
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            await nats.start()
            assert nats.servers[1].cluster_port != taken
            assert (await NatsCluster._js_info(nats.urls))["api"] is not None
        finally:
            await nats.stop()
    assert "address already in use" in (nats.servers[1].dir / "nats-server.log").read_text()


async def _replicas(bus: Bus) -> dict[str, tuple[int, int]]:
    """Each stream: (replicas configured, servers holding it: the leader and its peers)."""
    out = {}
    for name in STREAMS:
        info = await bus.js.stream_info(name)
        assert info.cluster is not None
        out[name] = (info.config.num_replicas, 1 + len(info.cluster.replicas or []))
    return out


@pytest.mark.slow
async def test_a_node_on_a_cluster_creates_every_stream_with_three_replicas(
        cluster: NatsCluster, tmp_path: Path) -> None:
    node = ratchet.Node(ratchet.NodeConfig(state_dir=tmp_path / "node", nats_url=cluster.url,
                                           nats_replicas=3, node_id="n1"),
                        ratchet.Registry([three]))
    await node.start()
    try:
        assert node.bus is not None and node.url == cluster.url
        assert await _replicas(node.bus) == {name: (3, 3) for name in STREAMS}
        client = await ratchet.Client.connect(cluster.urls, "acme", creds=node_key(tmp_path))
        try:
            task_id = (await client.submit("three", {}, "r3")).task_id
            assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
        finally:
            await client.close()
    finally:
        await node.stop()


@pytest.mark.slow
async def test_streams_made_with_one_replica_are_scaled_to_the_replicas_asked(
        cluster: NatsCluster) -> None:
    bus = await Bus.connect(cluster.urls, give_up_after=10)
    try:
        await bus.ensure_streams(stream_configs(replicas=1))
        assert {r for r, _ in (await _replicas(bus)).values()} == {1}
        await bus.ensure_streams(stream_configs(replicas=3))
        assert {r for r, _ in (await _replicas(bus)).values()} == {3}
    finally:
        await bus.close()


@pytest.mark.slow
async def test_more_replicas_than_servers_refuse_the_start_as_a_usage_error(
        cluster: NatsCluster, tmp_path: Path) -> None:
    refused = await asyncio.to_thread(subprocess.run, [
        str(RATCHET_BIN), "--state-dir", str(tmp_path / "node"), "--log-level", "error",
        "serve", "--app", APP, "--nats-url", cluster.url, "--nats-replicas", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "--nats-replicas 5" in refused.stderr and "at most the number of servers" \
        in refused.stderr


def _events_in_store(db: Path, task_ids: list[str]) -> dict[str, list[tuple[int, str]]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        out: dict[str, list[tuple[int, str]]] = {t: [] for t in task_ids}
        for task_id, seq, type_ in conn.execute(
                "SELECT task_id, sequence, type FROM events ORDER BY task_id, sequence"):
            if task_id in out:
                out[task_id].append((seq, type_))
        return out
    finally:
        conn.close()


def _unfinished(db: Path, task_ids: list[str]) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        done = {t for (t,) in conn.execute("SELECT task_id FROM tasks WHERE status = 'SUCCEEDED'")}
        return [t for t in task_ids if t not in done]
    finally:
        conn.close()


def _assert_succeeded_with_contiguous_events(db: Path, task_ids: list[str]) -> None:
    for task_id, events in _events_in_store(db, task_ids).items():
        assert [s for s, _ in events] == list(range(1, len(events) + 1)), task_id
        assert events[-1][1] == "task.succeeded", (task_id, events[-1])


async def _outcomes(client: ratchet.Client, task_ids: list[str], timeout: float) -> list[bool]:
    handles = [client.handle(t) for t in task_ids]
    return [outcome.ok async for outcome in client.results(handles, timeout=timeout)]


@pytest.mark.slow
async def test_three_nodes_ride_out_a_nats_server_sigkilled_mid_run(
        cluster: NatsCluster, tmp_path: Path, node_process: Callable[..., NodeProcess]) -> None:
    # One node names the servers with the flag repeated, the others comma-separated.
    first, *rest = cluster.urls
    flags = {"n1": (first, tuple(a for u in rest for a in ("--nats-url", u))),
             "n2": (cluster.url, ()), "n3": (cluster.url, ())}
    nodes = {}
    for name, (url, more) in flags.items():
        nodes[name] = node_process(url, app_spec=APP, args=(
            *LEASE, *more, "--node-id", name, "--nats-replicas", "3",
            "--recovery-interval", "1"))
        await asyncio.to_thread(nodes[name].start)
    client = await ratchet.Client.connect(cluster.urls, "acme", creds=node_key(tmp_path))
    try:
        handles = await asyncio.gather(*(client.submit_sync("ten", {"sleep": 0.05}, f"k-{i}")
                                         for i in range(100)))
        task_ids = [h.task_id for h in handles]
        # The mail stream's leader: its loss makes the others elect a new one mid-run.
        leader = (await client.js.stream_info(STREAM_MAIL)).cluster.leader  # type: ignore[union-attr]
        victim = next(i for i, s in enumerate(cluster.servers) if s.name == leader)
        cluster.kill(victim)
        running = _unfinished(tmp_path / "node" / "ratchet.db", task_ids)
        assert running, "every task ended before the kill: nothing was mid-run"
        assert await _outcomes(client, task_ids, timeout=120) == [True] * len(task_ids)
        after = (await client.submit_sync("three", {}, "after-kill")).task_id
        assert (await wait_terminal(client, after, timeout=60))[-1].type == "task.succeeded"
    finally:
        await client.close()
    _assert_succeeded_with_contiguous_events(tmp_path / "node" / "ratchet.db",
                                             [*task_ids, after])
    for name, node in nodes.items():
        assert node.proc is not None and node.proc.poll() is None, name  # rode it out
        assert await asyncio.to_thread(node.interrupt) == 0, name


async def _until(what: Callable[[], Any], timeout: float, why: str) -> Any:
    """Poll ``what`` (async) until it returns something truthy, bounded."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if value := await what():
            return value
        await asyncio.sleep(0.1)  # poll pacing under the deadline
    raise AssertionError(f"not within {timeout} s: {why}")


def _pause_until() -> str:
    """An RFC 3339 time a day ahead: a consumer paused until then stays paused for the test."""
    return (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _mail_consumers(client: ratchet.Client) -> list[str]:
    return [c.name for c in await client.js.consumers_info(STREAM_MAIL)
            if c.name.startswith("mail-")]


@pytest.mark.slow
async def test_mail_lost_with_jetstream_while_tasks_are_parked_is_made_good_from_the_store(
        cluster: NatsCluster, tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    node = NodeProc(tmp_path / "node", cluster.url, app=APP, log_level="warning",
                    args=("--nats-replicas", "3", "--recovery-interval", "0.5"), log_path=log)
    await asyncio.to_thread(node.start)
    client = await ratchet.Client.connect(cluster.urls, "acme", creds=node.creds)
    try:
        consumers = await _until(lambda: _mail_consumers_all(client), 30, "16 mail routers")
        # Parked: at an approval, in a durable sleep, at a join whose branches still run.
        parked = await _parked(client, 2)
        sleeping = [(await client.submit_sync("nap.short", {}, f"nap-{i}")).task_id
                    for i in range(3)]
        joining = [(await client.submit_sync("fan.all", {"sleep": 1.0}, f"fan-{i}")).task_id
                   for i in range(3)]
        for task_id in joining:
            await asyncio.wait_for(_seen(client, task_id, "fanout.started"), 30)
        # The mail routers stop taking mail (a paused consumer keeps its messages in the
        # stream), so what follows is certain to be in RATCHET_MAIL when it is purged:
        # each new task's task.start mail. (A branch tells its join in process, without
        # mail: the joins finish meanwhile, from their own process.)
        for name in consumers:
            await client.js.pause_consumer(STREAM_MAIL, name, _pause_until())
        queued = [(await client.submit_sync("three", {}, f"q-{i}")).task_id for i in range(30)]
        expected = len(queued)
        await _until(lambda: _mail_held(client, expected), 30, f"{expected} mails held")
        await client.js.purge_stream(STREAM_MAIL)  # what a power loss of JetStream does
        assert (await client.js.stream_info(STREAM_MAIL)).state.messages == 0
        for name in consumers:
            await client.js.resume_consumer(STREAM_MAIL, name)
        for task_id, request in parked:
            await _approve(client, task_id, request)
        everything = [t for t, _ in parked] + sleeping + joining + queued
        assert await _outcomes(client, everything, timeout=60) == [True] * len(everything)
    finally:
        await client.close()
        await asyncio.to_thread(node.stop)
    _assert_succeeded_with_contiguous_events(tmp_path / "node" / "ratchet.db", everything)
    # The store, not the lost mail, started the queued tasks: the sweeper said so.
    assert "recovered idle unfinished tasks" in log.read_text()


async def _mail_consumers_all(client: ratchet.Client) -> list[str] | None:
    names = await _mail_consumers(client)
    return names if len(names) == DEFAULT_PARTITIONS else None


async def _mail_held(client: ratchet.Client, expected: int) -> bool:
    return (await client.js.stream_info(STREAM_MAIL)).state.messages >= expected


async def _seen(client: ratchet.Client, task_id: str, event_type: str) -> None:
    async for event in client.watch(task_id):
        if event.type == event_type:
            return
    raise AssertionError(f"{task_id} ended before {event_type}")


@pytest.mark.slow
async def test_chaos_runs_that_kill_a_nats_server_with_each_node_lose_and_double_nothing() -> None:
    # bench/chaos.py --nats-cluster 3, small: each run SIGKILLs a NATS server (in turn,
    # the one before started again) and the node mid-task (a run whose task ends before
    # its kill point kills neither).
    result = await run_chaos(runs=3, seed=11, nats_cluster=3)
    assert result["nats_servers"] == 3 and 1 <= result["nats_server_kills"] <= 3
    assert result["lost_tasks"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    assert result["succeeded"] + result["failed_and_compensated"] + result[
        "cancelled_and_compensated"] + result["unknown_with_handoff"] == 3
