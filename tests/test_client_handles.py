"""Awaiting results (actors/transport/handles.py): ``submit`` returns a handle whose
``result()`` is the task's output or its typed error, ``results()`` awaits many tasks over
one consumer, and a client finds out within seconds that NATS is not there."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import nats
import pytest
from pydantic import BaseModel

import ratchet
from ratchet.actors.transport.bus import Bus
from ratchet.actors.transport.event_feed import EventFeed
from ratchet.protocol.errors import ToolOutcomeUnknown
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.messages import Event
from ratchet.protocol.subjects import STREAM_EVENTS
from ratchet.protocol.task_outcomes import OutcomeReader
from tests.apps import ten, three
from tests.conftest import NodeFactory, wait_terminal
from tests.keys import Secured, issued


class Note(BaseModel):
    text: str


class Receipt(BaseModel):
    id: str


@ratchet.tool(kind="write", args=Note, result=Receipt, key=lambda a: f"note:{a.text}")
async def post_note(ctx: ratchet.ToolContext, args: Note) -> Receipt:
    return Receipt(id=f"n-{args.text}")


@ratchet.tool(kind="write", args=Note, result=Receipt, key=lambda a: f"lost:{a.text}")
async def lost_note(ctx: ratchet.ToolContext, args: Note) -> Receipt:
    raise ToolOutcomeUnknown("the provider's answer was lost")


notes = ratchet.Workflow("notes", version=1)


@notes.step
async def write(ctx: ratchet.StepContext) -> dict[str, Any]:
    tool = lost_note if ctx.input.get("lose") else post_note
    receipt = await ctx.call(tool, Note(text=str(ctx.input.get("text", "x"))))
    return {"output": {"receipt": receipt.id}}


app = ratchet.Registry([three, ten, notes], tools=[post_note, lost_note])


async def _cancel(client: ratchet.Client, task_id: str) -> None:
    await client.request_admin("cancel", {"command_id": new_id("cmd"), "task_id": task_id,
                                          "args": {"reason": "wrong report"}})


async def test_a_handle_returns_the_output_of_a_task_that_succeeded(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    handle = await client.submit("three", {}, key="ok-1")
    assert (handle.task_id, handle.tenant, handle.key) == (task_id_for("acme", "ok-1"),
                                                           "acme", "ok-1")
    assert await handle.result(timeout=30) == {"count": 3}
    # Once it ended, the snapshot tells: the same answer again.
    assert await handle.result(timeout=30) == {"count": 3}
    assert (await handle.status()).status == "SUCCEEDED"


async def test_a_validated_submit_returns_a_handle_with_the_nodes_answer(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    handle = await client.submit_sync("notes", {"text": "a"}, key="sync-1")
    assert handle.accepted is not None and handle.accepted.created
    assert await handle.result(timeout=30) == {"receipt": "n-a"}
    with pytest.raises(ratchet.RemoteError) as refused:
        await client.submit_sync("no.such.flow", {}, key="sync-2")
    assert refused.value.code == ratchet.ErrorCode.INVALID_ARGUMENT


async def test_a_failed_task_raises_task_failed_with_its_reason_and_cause(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    handle = await client.submit("three", {"always_fail_at": 1}, key="bad-1")
    with pytest.raises(ratchet.TaskFailed) as failed:
        await handle.result(timeout=60)
    error = failed.value
    assert error.code == ratchet.ErrorCode.TASK_FAILED and error.task_id == handle.task_id
    assert error.reason == "step s1 failed 3 times"
    assert error.cause_code == "INTERNAL" and error.error["type"] == "RuntimeError"
    assert error.trace is not None and "step 1 always fails" in error.trace
    assert error.message.startswith(f"task {handle.task_id} failed: step s1 failed 3 times")
    assert error.to_wire()["details"]["task_id"] == handle.task_id


async def test_a_task_out_of_budget_raises_task_budget_exhausted(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    handle = await client.submit("notes", {"text": "b"}, key="budget-1",
                                 budget={"tool_calls": 0})
    with pytest.raises(ratchet.TaskBudgetExhausted) as spent:
        await handle.result(timeout=30)
    assert spent.value.code == ratchet.ErrorCode.BUDGET_EXHAUSTED
    assert isinstance(spent.value, ratchet.TaskFailed)
    assert spent.value.reason == "budget exhausted"


async def test_a_cancelled_task_raises_task_cancelled_naming_who_and_why(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    handle = await client.submit("ten", {"sleep": 30}, key="long-1")
    waiting = asyncio.ensure_future(handle.result(timeout=30))
    async for event in client.watch(handle.task_id):
        if event.type == "task.started":
            break
    await _cancel(client, handle.task_id)
    with pytest.raises(ratchet.TaskCancelled) as cancelled:
        await waiting
    assert cancelled.value.code == ratchet.ErrorCode.TASK_CANCELLED
    assert (cancelled.value.by, cancelled.value.reason) == ("local-admin", "wrong report")


async def test_a_task_waiting_for_a_human_raises_task_handed_off_live_and_later(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    handle = await client.submit("notes", {"text": "c", "lose": True}, key="lost-1")
    with pytest.raises(ratchet.TaskHandedOff) as live:
        await handle.result(timeout=30)
    assert live.value.status == "UNKNOWN" and live.value.retryable
    assert live.value.code == ratchet.ErrorCode.TASK_HANDED_OFF
    with pytest.raises(ratchet.TaskHandedOff) as later:  # from the snapshot this time
        await handle.result(timeout=30)
    assert later.value.task_id == handle.task_id


async def test_a_timeout_raises_result_timeout_and_the_task_goes_on(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    handle = await client.submit("ten", {"sleep": 30}, key="slow-1")
    with pytest.raises(ratchet.ResultTimeout) as timed_out:
        await handle.result(timeout=0.5)
    assert isinstance(timed_out.value, TimeoutError)
    assert timed_out.value.pending == [handle.task_id]
    assert timed_out.value.code == ratchet.ErrorCode.TIMEOUT
    assert (await handle.status()).status in ("QUEUED", "RUNNING")
    await _cancel(client, handle.task_id)


async def test_a_refused_jetstream_submit_times_out_saying_the_node_knows_no_such_task(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    handle = await client.submit("no.such.flow", {}, key="nope-1")
    with pytest.raises(ratchet.ResultTimeout, match="the node knows no task for 1 of them"):
        await handle.result(timeout=1.0)


async def test_results_awaits_many_tasks_over_one_consumer(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    node = await start_node(app)
    early = await client.submit("three", {}, key="early")
    await wait_terminal(client, early.task_id)  # ended before the wait: its snapshot tells
    handles = [early] + [await client.submit("three", {"always_fail_at": 0} if i % 4 == 0
                                             else {}, key=f"many-{i}") for i in range(12)]
    assert node.bus is not None
    js = node.bus.js
    before = (await js.stream_info(STREAM_EVENTS)).state.consumer_count  # the watch's
    seen: dict[str, ratchet.TaskOutcome] = {}
    consumers: list[int] = []
    async for outcome in client.results(handles, timeout=60):
        seen[outcome.handle.task_id] = outcome
        consumers.append((await js.stream_info(STREAM_EVENTS)).state.consumer_count - before)
    assert set(seen) == {h.task_id for h in handles}
    assert consumers[0] == 1 and max(consumers) == 1  # one consumer for thirteen tasks
    failed = {t for t, o in seen.items() if not o.ok}
    assert failed == {task_id_for("acme", f"many-{i}") for i in (0, 4, 8)}
    assert all(isinstance(seen[t].error, ratchet.TaskFailed) for t in failed)
    assert seen[early.task_id].result() == {"count": 3}


async def test_results_takes_only_handles_of_the_clients_tenant(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    mine = client.handle(task_id_for("acme", "x"))
    theirs = ratchet.TaskHandle(task_id_for("globex", "y"), "globex", "y", client)
    with pytest.raises(ratchet.InvalidMessage):
        async for _ in client.results([mine, theirs], timeout=5):
            pass


async def test_watch_of_a_task_nobody_submitted_says_not_found(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    with pytest.raises(ratchet.NotFound, match="no such task"):
        async for _ in client.watch(task_id_for("acme", "never"), missing_after=0.5):
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_connect_to_an_unreachable_nats_fails_within_its_bound_with_one_line() -> None:
    port = _free_port()  # closed again: nothing listens there
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(ratchet.NatsUnreachable) as unreachable:
        await ratchet.Client.connect(f"nats://ann:s3cret@127.0.0.1:{port}", "acme",
                                     connect_timeout=1.0)
    assert loop.time() - began < 3.0
    assert str(unreachable.value) == f"cannot reach NATS at nats://ann:***@127.0.0.1:{port}"
    assert unreachable.value.code == ratchet.ErrorCode.UNAVAILABLE


def _event(task_id: str, sequence: int, type_: str, **payload: Any) -> Event:
    return Event(event_id=f"evt_{task_id}_{sequence}", task_id=task_id, tenant="acme",
                 sequence=sequence, type=type_, aggregate_version=sequence,
                 occurred_at=0.0, producer="n1", payload=payload)


def test_a_replayed_handoff_a_human_resolved_since_is_no_outcome() -> None:
    reader = OutcomeReader()
    assert reader.read(_event("t1", 5, "task.handoff", reason="crash loop")) == []
    assert reader.read(_event("t1", 6, "task.recovered", reason="actor_restart")) == []
    assert reader.caught_up() == []
    [(task_id, outcome)] = reader.read(_event("t1", 9, "task.succeeded", output={"n": 1}))
    assert (task_id, outcome) == ("t1", {"n": 1})


def test_a_handoff_is_an_outcome_once_nothing_follows_it() -> None:
    reader = OutcomeReader()
    assert reader.read(_event("t2", 4, "task.unknown", reason="lost answer")) == []
    [(task_id, outcome)] = reader.caught_up()
    assert task_id == "t2" and isinstance(outcome, ratchet.TaskHandedOff)
    assert outcome.message == "task t2 waits for a human (UNKNOWN): lost answer"
    [(_, failed)] = reader.read(_event("t3", 7, "task.failed", reason="budget exhausted",
                                       error={"code": "BUDGET_EXHAUSTED", "type": "X",
                                              "message": "spent", "trace": "tb"}))
    assert isinstance(failed, ratchet.TaskBudgetExhausted) and failed.trace == "tb"
    assert "trace" not in failed.to_wire()["details"]["error"]


async def test_a_feed_of_new_events_skips_history_and_resumes_after_a_lost_consumer(
        nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    subject = "ratchet.events.acme.tsk_a.task.progress"
    nc = await nats.connect(nats_url)
    feed = EventFeed(nc, "ratchet.events.acme.*.task.>", new_only=True)
    try:
        for _ in range(3):
            await bus.js.publish(subject, b"old")
        await feed.start()
        assert feed.backlog == 0  # the three before it are history, not delivered
        await feed.close()  # lost before it delivered anything: resumes where it began
        await bus.js.publish(subject, b"new-1")
        first = await asyncio.wait_for(feed.next(), 10)
        await feed.close()  # as after a gap: resumes after the last message seen
        await bus.js.publish(subject, b"new-2")
        second = await asyncio.wait_for(feed.next(), 10)
        assert [first.data, second.data] == [b"new-1", b"new-2"]
        assert second.metadata.sequence.stream == 5
    finally:
        await feed.close()
        await nc.close()
        await bus.close()


def _snapshot(status: str, version: int) -> ratchet.TaskSnapshot:
    return ratchet.TaskSnapshot(task_id="t4", tenant="acme", workflow="w", workflow_version=1,
                                status=status, version=version, next_step=0,
                                last_checkpoint=0, last_event_sequence=version,
                                created_at=0.0, updated_at=0.0)


def test_a_replayed_handoff_is_dropped_once_the_snapshot_shows_the_task_moved_on() -> None:
    reader = OutcomeReader()
    reader.read(_event("t4", 6, "task.handoff", reason="crash loop"))
    [(_, held)] = reader.caught_up()
    assert isinstance(held, ratchet.TaskHandedOff) and held.version == 6
    assert held.superseded_by(_snapshot("RUNNING", 8))  # approved since: steps go on
    assert not held.superseded_by(_snapshot("WAITING_APPROVAL", 6))  # still waiting
    assert not held.superseded_by(_snapshot("RUNNING", 5))  # the snapshot is older


async def test_a_feed_honours_a_cancellation_that_was_swallowed_below_it(
        nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    feed = EventFeed(nc, "ratchet.events.acme.*.task.>", new_only=True)
    task = asyncio.current_task()
    assert task is not None
    try:
        task.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass  # lost, as nats-py's next_msg loses one that meets a heartbeat
        with pytest.raises(asyncio.CancelledError):  # not a wait for the next event
            await feed.next()
    finally:
        task.uncancel()
        await feed.close()
        await nc.close()


async def test_a_tenants_key_awaits_its_results_and_may_not_await_another_tenants(
        secured: Secured) -> None:
    ann = await issued(secured.admin, "ann", "acme", ["producer", "subscriber"])
    client = await ratchet.Client.connect(secured.url, "acme", creds=ann)
    try:
        handles = [await client.submit("three", {}, key=f"own-{i}") for i in range(3)]
        outcomes = [o async for o in client.results(handles, timeout=30)]
        assert sorted(o.handle.task_id for o in outcomes) == sorted(h.task_id for h in handles)
        assert await handles[0].result(timeout=30) == {"count": 3}
        nosy = ratchet.Client(client.nc, "globex", ann, client.refusals)
        with pytest.raises(ratchet.RatchetError) as refused:  # NATS refuses the consumer
            await nosy.handle(task_id_for("globex", "x")).result(timeout=10)
        assert refused.value.code == ratchet.ErrorCode.PERMISSION_DENIED
    finally:
        await client.close()


async def test_a_request_nobody_serves_is_unavailable_not_a_nats_exception(
        client: ratchet.Client) -> None:
    with pytest.raises(ratchet.RatchetError) as unserved:  # NATS is up, no node runs
        await client.submit_sync("three", {}, key="nobody")
    assert unserved.value.code == ratchet.ErrorCode.UNAVAILABLE
    assert unserved.value.message == "no node serves ratchet.api.acme.submit"


async def test_a_server_that_hangs_up_after_accepting_is_asked_again_within_the_timeout(
        nats_url: str) -> None:
    upstream = nats_url.rsplit(":", 1)
    hung_up = 0

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal hung_up
        if hung_up < 2:  # the first two connections: taken, then dropped (a busy server)
            hung_up += 1
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(upstream[0][7:], int(upstream[1]))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = await ratchet.Client.connect(f"nats://127.0.0.1:{port}", "acme",
                                              connect_timeout=5.0)
        assert hung_up == 2
        await client.close()
    finally:
        server.close()
