"""One node, a real nats-server, a real SQLite file: submit → events → SUCCEEDED."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

import ratchet
from ratchet.protocol.codec import decode_map
from ratchet.protocol.messages import Reply
from ratchet.protocol.subjects import STREAM_DLQ
from tests.apps import RUNS
from tests.conftest import NodeFactory, assert_contiguous, wait_terminal
from tests.keys import client_as


async def test_a_submitted_task_runs_to_succeeded_with_contiguous_events(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    task_id = (await client.submit("three", {"x": 1}, key="order-1")).task_id
    events = await wait_terminal(client, task_id)
    assert_contiguous(events)
    assert [e.type for e in events] == ["task.queued", "task.started"] + ["step.completed"] * 4 + [
        "task.succeeded"]
    assert events[-1].payload == {"output": {"count": 3}}
    assert all(e.tenant == "acme" and e.task_id == task_id for e in events)
    assert [e.aggregate_version for e in events] == sorted(e.aggregate_version for e in events)
    snapshot = await client.get(task_id)
    assert (snapshot.status, snapshot.next_step, snapshot.last_event_sequence) == (
        "SUCCEEDED", 4, len(events))


async def test_the_same_request_twice_makes_one_task(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    first = (await client.submit("three", {"x": 1}, key="dup")).task_id
    await wait_terminal(client, first)
    again = await client.submit_sync("three", {"x": 1}, key="dup")
    assert again.accepted is not None
    assert again.accepted.model_dump() == {"task_id": first, "status": "SUCCEEDED",
                                           "created": False}
    assert await node.store.count("tasks") == 1  # type: ignore[union-attr]
    assert RUNS[f"{first}:s0"] == 1


async def test_the_same_key_with_another_body_is_a_typed_conflict(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    await client.submit_sync("three", {"x": 1}, key="k")
    with pytest.raises(ratchet.RemoteError) as info:
        await client.submit_sync("three", {"x": 2}, key="k")
    assert info.value.wire_code == "CONFLICT"
    assert info.value.details["idempotency_key"] == "k"
    assert await node.store.count("tasks") == 1  # type: ignore[union-attr]
    assert await node.store.count("request_conflicts") == 1  # type: ignore[union-attr]


async def test_a_conflicting_resubmission_over_jetstream_is_answered_and_recorded_not_run(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    task_id = (await client.submit("three", {"x": 1}, key="k2")).task_id
    await wait_terminal(client, task_id)
    # A different body under the same key, past JetStream's own dedup (other Nats-Msg-Id),
    # asking for an answer on a reply subject.
    inbox = client.nc.new_inbox()
    replies = await client.nc.subscribe(inbox)
    await client.js.publish("ratchet.submit.acme", submit_bytes({"x": 2}, "k2", reply_to=inbox),
                            headers={"Nats-Msg-Id": "other"})
    answer = Reply.model_validate(decode_map((await replies.next_msg(timeout=10)).data))
    assert not answer.ok and answer.error is not None and answer.error.code == "CONFLICT"
    assert answer.correlation_id == "c-k2"
    assert await node.store.count("request_conflicts") == 1  # type: ignore[union-attr]
    assert await node.store.count("tasks") == 1  # type: ignore[union-attr]


def submit_bytes(input: dict[str, Any], key: str, reply_to: str | None = None) -> bytes:
    return msgpack.packb({"schema_version": 1, "type": "task.submit", "message_id": f"m-{key}",
                          "correlation_id": f"c-{key}", "reply_to": reply_to,
                          "body": {"workflow": "three", "input": input, "idempotency_key": key}})


async def test_a_step_that_raises_once_is_retried_by_a_restart_and_earlier_steps_run_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(task_backoff_base=0.001, task_backoff_cap=0.01)
    task_id = (await client.submit("ten", {"fail_once_at": 4}, key="flaky")).task_id
    events = await wait_terminal(client, task_id)
    assert_contiguous(events)
    assert events[-1].type == "task.succeeded"
    assert [RUNS[f"{task_id}:s{i}"] for i in range(10)] == [1, 1, 1, 1, 2, 1, 1, 1, 1, 1]
    failed = [e for e in events if e.type == "step.failed"]
    assert [(e.payload["step"], e.payload["attempt"]) for e in failed] == [("s4", 1)]
    recovered = [e for e in events if e.type == "task.recovered"]
    assert recovered[0].payload["reason"] == "actor_restart"
    assert recovered[0].payload["next_step"] == 4
    assert recovered[0].payload["steps_skipped"] == ["s0", "s1", "s2", "s3"]


@pytest.mark.parametrize(
    ("config", "runs", "reason"),
    [
        ({"max_step_attempts": 3}, 3, "step s1 failed 3 times"),
        # The supervisor's restart intensity gives up first: escalation ends the task.
        ({"max_step_attempts": 10, "task_max_restarts": 2}, 3, "restart intensity exceeded"),
    ],
)
async def test_a_step_that_keeps_failing_ends_the_task_failed_not_the_node(
    start_node: NodeFactory, client: ratchet.Client, config: dict[str, int], runs: int,
    reason: str,
) -> None:
    await start_node(task_backoff_base=0.001, task_backoff_cap=0.01, **config)
    bad = (await client.submit("three", {"always_fail_at": 1}, key="bad")).task_id
    events = await wait_terminal(client, bad)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == reason
    assert RUNS[f"{bad}:s0"] == 1 and RUNS[f"{bad}:s1"] == runs
    good = (await client.submit("three", {}, key="good")).task_id  # the node still serves
    assert (await wait_terminal(client, good))[-1].type == "task.succeeded"
    assert (await client.get(bad)).status == "FAILED"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\x93\x01\x02", "INVALID_ARGUMENT"),  # msgpack, but an array
        (b"\xc1garbage", "INVALID_ARGUMENT"),
        (msgpack.packb({"schema_version": 1, "type": "task.submit", "message_id": "m",
                        "correlation_id": "c", "body": {"workflow": "three"}}),
         "INVALID_ARGUMENT"),
        (msgpack.packb({"schema_version": 1, "type": "task.submit", "message_id": "m",
                        "correlation_id": "c",
                        "body": {"workflow": "nope", "idempotency_key": "x"}}),
         "INVALID_ARGUMENT"),
    ],
)
async def test_a_malformed_submission_is_dead_lettered_and_the_node_keeps_serving(
    start_node: NodeFactory, client: ratchet.Client, payload: bytes, code: str
) -> None:
    node = await start_node()
    await client.js.publish("ratchet.submit.acme", payload)
    sub = await client.js.pull_subscribe("ratchet.dlq.submit.acme", "t", stream=STREAM_DLQ)
    [msg] = await sub.fetch(1, timeout=10)  # waits for the dead letter to be published
    assert msg.data == payload
    assert msg.headers is not None and msg.headers["Ratchet-Error-Code"] == code
    rows = await node.store.dead_letters()  # type: ignore[union-attr]
    assert [(r["code"], r["subject"]) for r in rows] == [(code, "ratchet.submit.acme")]
    task_id = (await client.submit("three", {}, key="after-bad")).task_id
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"


async def test_a_task_of_another_tenant_is_not_found(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    node = await start_node()
    task_id = (await client.submit("three", {}, key="mine")).task_id
    await wait_terminal(client, task_id)
    other = await client_as(node, nats_url, "ivan", "intruder", roles=["producer"])
    try:
        with pytest.raises(ratchet.RemoteError) as info:
            await other.get(task_id)
        assert info.value.wire_code == "NOT_FOUND"
    finally:
        await other.close()


async def test_a_node_restart_recovers_unfinished_tasks_from_their_checkpoints(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    task_id = (await client.submit("ten", {"sleep": 0.02}, key="long")).task_id
    async for event in client.watch(task_id):
        if event.type == "step.completed" and event.payload["index"] == 3:
            break
    await node.stop()  # a clean stop: the task stays RUNNING at its last checkpoint
    await start_node()
    events = await wait_terminal(client, task_id)
    assert_contiguous(events)
    assert events[-1].type == "task.succeeded"
    recovered = [e for e in events if e.type == "task.recovered"]
    # It let its partitions go cleanly and took them back: a hand-over (not a crash).
    assert recovered and recovered[0].payload["reason"] == "partition_handover"
    assert all(RUNS[f"{task_id}:s{i}"] == 1 for i in range(10))
