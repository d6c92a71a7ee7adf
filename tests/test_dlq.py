"""``admin dlq-list|show|replay|purge``: the dead-letter queue read with each letter's reason
and original headers, replayed to the original subject (bounded, no loop for a poison
message), purged; and the ``dead_letters`` table bounded under a flood."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import msgpack
from nats.aio.msg import Msg

import ratchet
from ratchet.persistence.dead_letter_rows import MAX_REPLAYS, DeadLetterLimits
from ratchet.persistence.store import Store
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.subjects import STREAM_DLQ
from tests.conftest import NodeFactory, wait_terminal
from tests.keys import client_as
from tests.test_poison import submit_map

GARBAGE = b"\xc1 not msgpack at all"


async def ask(client: ratchet.Client, verb: str, **args: Any) -> dict[str, Any]:
    return await client.request_admin(verb, {"command_id": new_id("cmd"), "args": args})


async def refused(client: ratchet.Client, verb: str, **args: Any) -> str:
    try:
        await ask(client, verb, **args)
    except ratchet.RemoteError as exc:
        return str(exc.code)
    raise AssertionError(f"{verb} was not refused")


class Letters:
    """The DLQ stream's messages of one subject, as they are published (bounded waits)."""

    def __init__(self, client: ratchet.Client, subject: str) -> None:
        self.client, self.subject = client, subject
        self.sub: Any = None

    async def next(self) -> Msg:
        if self.sub is None:
            self.sub = await self.client.js.pull_subscribe(self.subject, new_id("d"),
                                                           stream=STREAM_DLQ)
        msgs: list[Msg] = await self.sub.fetch(1, timeout=15)
        await msgs[0].ack()
        return msgs[0]


async def test_a_dead_letter_is_listed_with_its_reason_and_headers_to_its_tenant_only(
    start_node: NodeFactory, nats_url: str
) -> None:
    node = await start_node()
    viewer = await client_as(node, nats_url, "vic", "acme", ["viewer"])
    stranger = await client_as(node, nats_url, "sam", "globex", ["viewer", "operator"])
    root = await client_as(node, nats_url, "root", "_system", ["viewer"])
    try:
        letters = Letters(viewer, "ratchet.dlq.submit.acme")
        await viewer.js.publish("ratchet.submit.acme", GARBAGE,
                                headers={"X-Trace": "trace-1", "Nats-Msg-Id": "orig-1"})
        published = await letters.next()
        assert published.headers is not None and published.headers["X-Trace"] == "trace-1"
        assert published.headers["Ratchet-Error-Code"] == "INVALID_ARGUMENT"
        listed = await ask(viewer, "dlq-list")
        [subject] = listed["subjects"]
        assert subject["dlq_subject"] == "ratchet.dlq.submit.acme" and subject["count"] == 1
        [letter] = listed["letters"]
        assert letter["subject"] == "ratchet.submit.acme" and letter["code"] == "INVALID_ARGUMENT"
        assert letter["headers"]["X-Trace"] == "trace-1" and letter["message"]
        shown = await ask(viewer, "dlq-show", id=letter["id"])
        assert base64.b64decode(shown["raw_b64"]) == GARBAGE and shown["decoded"] is None
        # another tenant sees none of it, a viewer cannot replay, _system sees every tenant's
        assert (await ask(stranger, "dlq-list"))["letters"] == []
        assert await refused(stranger, "dlq-show", id=letter["id"]) == "NOT_FOUND"
        assert await refused(viewer, "dlq-replay", ids=[letter["id"]]) == "PERMISSION_DENIED"
        assert [x["id"] for x in (await ask(root, "dlq-list"))["letters"]] == [letter["id"]]
        replayed = await ask(stranger, "dlq-replay", ids=[letter["id"]])
        assert replayed["results"] == [{"id": letter["id"], "outcome": "not found"}]
    finally:
        for c in (viewer, stranger, root):
            await c.close()


async def test_a_replayed_poison_message_goes_back_to_the_dlq_and_its_replays_are_bounded(
    start_node: NodeFactory, nats_url: str
) -> None:
    node = await start_node()
    ops = await client_as(node, nats_url, "ops", "acme", ["viewer", "operator"])
    try:
        letters = Letters(ops, "ratchet.dlq.submit.acme")
        await ops.js.publish("ratchet.submit.acme", GARBAGE, headers={"X-Trace": "t-2"})
        await letters.next()
        [first] = (await ask(ops, "dlq-list"))["letters"]
        latest = first
        for n in range(1, MAX_REPLAYS + 1):
            [done] = (await ask(ops, "dlq-replay", ids=[latest["id"]]))["results"]
            assert done["outcome"] == "replayed" and done["replay"] == n
            assert done["subject"] == "ratchet.submit.acme"
            again = await letters.next()  # the same garbage, dead-lettered again
            assert again.data == GARBAGE and again.headers is not None
            assert again.headers["Ratchet-Replay-Of"] == str(first["id"])
            assert again.headers["X-Trace"] == "t-2"
            latest = (await ask(ops, "dlq-list", after=latest["id"]))["letters"][0]
            assert latest["replay_of"] == first["id"]
        [no] = (await ask(ops, "dlq-replay", ids=[latest["id"]]))["results"]
        assert no["outcome"].startswith(f"refused: its message was replayed {MAX_REPLAYS} times")
        assert len((await ask(ops, "dlq-list"))["letters"]) == MAX_REPLAYS + 1
    finally:
        await ops.close()


async def test_a_replay_reaches_the_original_subject_and_the_submission_then_runs(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(clock=clock, submit_rate=0.01, submit_burst=1)
    ops = await client_as(node, nats_url, "ops", "acme", ["viewer", "operator"])
    try:
        first = (await client.submit("three", {}, key="first")).task_id
        await wait_terminal(client, first)
        letters = Letters(ops, "ratchet.dlq.submit.acme")
        await client.js.publish("ratchet.submit.acme", msgpack.packb(submit_map("over")))
        assert ((await letters.next()).headers or {})["Ratchet-Error-Code"] == "RATE_LIMITED"
        [letter] = (await ask(ops, "dlq-list"))["letters"]
        clock.advance(1000.0)  # the tenant's bucket has refilled
        [done] = (await ask(ops, "dlq-replay", ids=[letter["id"]]))["results"]
        assert done["outcome"] == "replayed"
        replayed = task_id_for("acme", "over")
        events = await wait_terminal(client, replayed)
        assert events[-1].type == "task.succeeded"
    finally:
        await ops.close()


async def test_purge_removes_letters_by_id_then_all_of_them_with_the_streams_copies(
    start_node: NodeFactory, nats_url: str
) -> None:
    node = await start_node()
    ops = await client_as(node, nats_url, "ops", "acme", ["viewer", "operator"])
    try:
        letters = Letters(ops, "ratchet.dlq.submit.acme")
        for _ in range(3):
            await ops.js.publish("ratchet.submit.acme", GARBAGE)
            await letters.next()
        ids = [x["id"] for x in (await ask(ops, "dlq-list"))["letters"]]
        assert await refused(ops, "dlq-purge") == "INVALID_ARGUMENT"  # says what to purge
        assert (await ask(ops, "dlq-purge", ids=ids[:1]))["removed"] == 1
        purged = await ask(ops, "dlq-purge", all=True)
        assert purged == {"removed": 2, "stream_purged": "ratchet.dlq.*.acme"}
        assert (await ask(ops, "dlq-list"))["subjects"] == []
        info = await ops.js.stream_info(STREAM_DLQ)
        assert info.state.messages == 0
    finally:
        await ops.close()


async def test_the_dead_letters_table_stays_bounded_under_a_flood_of_garbage(
    start_node: NodeFactory, nats_url: str
) -> None:
    node = await start_node(dead_letters=DeadLetterLimits(max_rows=40, max_bytes=30_000))
    assert isinstance(node.store, Store)  # serve --dead-letters-max 40 --dead-letters-max-mb …
    flooder = await client_as(node, nats_url, "flo", "acme", ["viewer"])
    try:
        letters = Letters(flooder, "ratchet.dlq.submit.acme")
        junk = GARBAGE + b"x" * 1000
        await asyncio.gather(*(flooder.js.publish("ratchet.submit.acme", junk)
                               for _ in range(300)))
        for _ in range(300):  # every one recorded (then trimmed) and published to the DLQ
            await letters.next()
        rows = await node.store._rows("SELECT COUNT(*), SUM(size), MAX(id) FROM dead_letters")
        count, size, newest = rows[0]
        assert count <= 40 and size <= 30_000
        assert newest == 300  # the newest are the ones kept
        listed = await ask(flooder, "dlq-list", limit=500)
        assert listed["subjects"][0]["count"] == count
    finally:
        await flooder.close()


async def test_the_store_trims_by_bytes_and_rows_and_keeps_the_newest(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    store.dead_letter_limits = DeadLetterLimits(max_rows=100, max_bytes=50_000)
    try:
        for i in range(1000):
            await store.record_dead_letter(
                subject="ratchet.submit.acme", raw=bytes(500 + i % 3 * 1000),
                error={"code": "INVALID_ARGUMENT", "message": "bad"},
                dlq_subject="ratchet.dlq.submit.acme", now=float(i))
        [(count, size, oldest, newest)] = await store._rows(
            "SELECT COUNT(*), SUM(size), MIN(id), MAX(id) FROM dead_letters")
        assert count <= 100 and size <= 50_000 and newest == 1000
        assert newest - oldest + 1 == count  # contiguous: only the oldest went
    finally:
        await store.close()
