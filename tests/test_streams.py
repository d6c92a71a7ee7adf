"""JetStream streams purged or deleted under a running node (issue 17): it creates its
streams and consumers again and goes on, and the store finishes what the streams lost.
Real `ratchet serve` process, real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import ratchet
from ratchet.protocol.codec import encode
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import STREAM_MAIL, STREAM_SUBMIT, decision_subject
from tests.conftest import NodeProcess, wait_terminal

pytestmark = pytest.mark.slow  # a real node process

ARGS = ("--recovery-interval", "1", "--app", "tests.fault_apps:app")


async def _parked(client: ratchet.Client, n: int) -> list[tuple[str, dict[str, Any]]]:
    """``n`` approve tasks, each parked at its approval: (task id, approval.requested)."""
    parked = []
    for i in range(n):
        task_id = (await client.submit_sync("approve", {"amount": i}, f"park-{i}")).task_id

        async def requested(task_id: str = task_id) -> dict[str, Any]:
            async for event in client.watch(task_id):
                if event.type == "approval.requested":
                    return event.payload
            raise AssertionError("ended before its approval")

        parked.append((task_id, await asyncio.wait_for(requested(), 30)))
    return parked


async def _approve(client: ratchet.Client, task_id: str, request: dict[str, Any]) -> None:
    approval_id = request["approval_id"]
    env = Envelope(type="approval.decision", message_id=f"{approval_id}-ok",
                   correlation_id=approval_id,
                   body={"task_id": task_id, "approval_id": approval_id, "decision": "approve",
                         "decided_by": "dana", "request_hash": request["request_hash"]})
    await client.publish_signed(decision_subject("acme"), encode(env))


async def _all_succeed(client: ratchet.Client, task_ids: list[str]) -> None:
    finals = await asyncio.gather(*(wait_terminal(client, t, timeout=90) for t in task_ids))
    assert [events[-1].type for events in finals] == ["task.succeeded"] * len(task_ids)


async def _publish_until_taken(client: ratchet.Client, key: str) -> str:
    """A JetStream submit, retried (bounded) while its stream is missing."""
    for _ in range(100):
        try:
            return (await client.submit("three", {}, key)).task_id
        except Exception:  # no stream takes it yet: the node creates it again
            await asyncio.sleep(0.1)  # a producer's retry pacing
    raise AssertionError("the submit stream never came back")


async def test_mail_purged_while_tasks_run_and_park_is_made_good_from_the_store(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
) -> None:
    node = node_process(nats_url, args=ARGS[:2], app_spec="tests.fault_apps:app")
    await asyncio.to_thread(node.start)
    parked = await _parked(client, 5)
    running = [(await client.submit_sync("ten", {"sleep": 0.1}, f"run-{i}")).task_id
               for i in range(20)]
    # A burst over JetStream, purged while its task.start mail is on the way: some of it
    # is lost for certain only in a few runs; every task must finish in all of them.
    burst = [(await client.submit("three", {}, f"burst-{i}")).task_id for i in range(60)]
    purged = 0
    for _ in range(10):
        purged += (await client.js.stream_info(STREAM_MAIL)).state.messages
        await client.js.purge_stream(STREAM_MAIL)
        await asyncio.sleep(0.02)  # purge again a little later, not a wait for a condition
    for task_id, request in parked:
        await _approve(client, task_id, request)
    await _all_succeed(client, [t for t, _ in parked] + running + burst)
    assert node.proc is not None and node.proc.poll() is None
    assert await asyncio.to_thread(node.interrupt) == 0


async def test_streams_deleted_under_a_running_node_are_created_again_and_work_goes_on(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
) -> None:
    node = node_process(nats_url, args=ARGS[:2], app_spec="tests.fault_apps:app")
    await asyncio.to_thread(node.start)
    parked = await _parked(client, 3)
    running = [(await client.submit_sync("ten", {"sleep": 0.1}, f"run-{i}")).task_id
               for i in range(10)]
    await client.js.delete_stream(STREAM_MAIL)
    await client.js.delete_stream(STREAM_SUBMIT)
    # Work keeps coming: over the API (its task.start mail needs the mail stream) and over
    # JetStream (needs the submit stream, which the node creates again).
    later = [(await client.submit_sync("three", {}, f"api-{i}")).task_id for i in range(10)]
    later += [await _publish_until_taken(client, f"js-{i}") for i in range(10)]
    for task_id, request in parked:
        await _approve(client, task_id, request)
    await _all_succeed(client, [t for t, _ in parked] + running + later)
    assert node.proc is not None and node.proc.poll() is None, "the node stayed up"
    assert await asyncio.to_thread(node.interrupt) == 0
