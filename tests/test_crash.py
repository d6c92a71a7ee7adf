"""SIGKILL a real node process mid-task, start it again, check the invariants."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import ratchet
from ratchet.protocol.subjects import STREAM_EVENTS
from tests.conftest import NodeProcess, assert_contiguous, wait_terminal

pytestmark = pytest.mark.slow  # real node processes, killed


async def _stream_events(client: ratchet.Client, task_id: str) -> list[ratchet.Event]:
    """Every message the events stream holds for the task, duplicates included."""
    from ratchet.protocol.codec import decode_map

    sub = await client.js.subscribe(f"ratchet.events.acme.{task_id}.>", stream=STREAM_EVENTS,
                                    ordered_consumer=True)
    info = await client.js.stream_info(STREAM_EVENTS)
    out: list[ratchet.Event] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except Exception:
                break
            out.append(ratchet.Event.model_validate(decode_map(msg.data)))
            if msg.metadata.sequence.stream >= info.state.last_seq:
                break
    finally:
        await sub.unsubscribe()
    return out


async def test_a_node_killed_mid_task_resumes_and_runs_committed_steps_once(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    tmp_path: Path,
) -> None:
    step_log = tmp_path / "steps.log"
    node = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(step_log)})
    await asyncio.to_thread(node.start)
    task_id = (await client.submit("ten", {"sleep": 0.05}, key="crash-me")).task_id
    async for event in client.watch(task_id):
        if event.type == "step.completed" and event.payload["index"] == 4:
            break
    await asyncio.to_thread(node.kill)
    killed_after = Counter(step_log.read_text().split("\n"))

    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id, timeout=60)
    assert events[-1].type == "task.succeeded"
    assert_contiguous(events)

    runs = Counter(line.split()[1] for line in step_log.read_text().splitlines())
    assert all(runs[f"s{i}"] == 1 for i in range(5)), runs  # committed before the kill
    interrupted = [f"s{i}" for i in range(5, 10) if runs[f"s{i}"] == 2]
    assert len(interrupted) <= 1, runs  # at most the step in flight ran twice
    assert all(runs[f"s{i}"] in (1, 2) for i in range(5, 10)) and runs["finish"] == 1
    assert killed_after  # the log was written before the kill

    recovered = [e for e in events if e.type == "task.recovered"]
    assert len(recovered) == 1 and recovered[0].payload["reason"] == "node_recovery"
    assert recovered[0].payload["next_step"] >= 5

    in_stream = await _stream_events(client, task_id)
    sequences = [e.sequence for e in in_stream]
    assert sequences == list(range(1, len(events) + 1)), "lost or duplicated events in the stream"
    assert node.interrupt() == 0
