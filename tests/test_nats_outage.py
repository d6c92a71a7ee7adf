"""nats-server SIGKILLed with tasks in flight, then restarted on the same port and store:
the node (a real ``ratchet serve``) reconnects and every acknowledged task finishes."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import ratchet
from ratchet.supervisors.node.embedded_nats import EmbeddedNats, free_port
from tests.conftest import NodeProcess, node_key, wait_terminal

pytestmark = pytest.mark.slow  # real processes killed


async def test_nats_server_killed_and_restarted_loses_no_acknowledged_task(
    tmp_path: Path, node_process: Callable[..., NodeProcess],
) -> None:
    server = EmbeddedNats(tmp_path / "nats", port=free_port())
    url = await server.start()
    node = node_process(url, args=("--recovery-interval", "1"))
    await asyncio.to_thread(node.start)
    assert node.proc is not None
    client = await ratchet.Client.connect(url, "acme", creds=node_key(tmp_path))
    try:
        acked = [(await client.submit_sync("three", {"sleep": 0.05}, f"n-{i}")).task_id
                 for i in range(50)]
        proc = server._proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)  # mid-flight: steps running, events unpublished
        await proc.wait()
        await server.start()  # the same port and JetStream store, as a supervisor would
        for task_id in acked:
            events = await wait_terminal(client, task_id, timeout=60)
            assert events[-1].type == "task.succeeded", (task_id, events[-1].type)
            sequences = [e.sequence for e in events]
            assert sequences == list(range(1, len(sequences) + 1))  # contiguous, no gaps
        assert node.proc.poll() is None  # the node rode it out
        after = (await client.submit_sync("three", {}, "after-outage")).task_id
        assert (await wait_terminal(client, after, timeout=30))[-1].type == "task.succeeded"
    finally:
        await client.close()
        if node.proc.poll() is None:
            assert await asyncio.to_thread(node.interrupt) == 0
        await server.stop()
