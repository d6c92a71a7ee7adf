"""Poison and malformed input (issue 17): too deep, bin for str, wrong admin argument
types, bad tenant tokens, unreadable envelopes with a readable reply subject, and handling
that keeps raising — each answered with a typed error or dead-lettered, never redelivered
for ever."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
from nats.aio.msg import Msg

import ratchet
from ratchet.protocol.auth import inbox_prefix
from ratchet.protocol.codec import MAX_DEPTH, decode_map, encode, reply_route
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import Envelope, Reply
from ratchet.protocol.subjects import STREAM_DLQ, STREAM_SUBMIT
from ratchet.supervisors.services import routing
from ratchet.supervisors.services.intake import Acceptor
from tests.conftest import NodeFactory, wait_terminal
from tests.test_admin import admin


def submit_map(key: str, **overrides: Any) -> dict[str, Any]:
    env: dict[str, Any] = {"schema_version": 1, "type": "task.submit", "message_id": f"m-{key}",
                           "correlation_id": f"c-{key}",
                           "body": {"workflow": "three", "idempotency_key": key, "input": {}}}
    env.update(overrides)
    return env


def nested(depth: int) -> bytes:
    """A map nested ``depth`` maps deep (built by hand: msgpack's packer stops at 511)."""
    return b"\x81\xa1a" * (depth - 1) + b"\x80"


def own_inbox(client: ratchet.Client, name: str) -> str:
    """A reply subject under the client's key's own inbox: the only kind the answer to a
    submit's ``reply_to`` is published on (docs/security.md)."""
    assert client.signer is not None
    return f"{inbox_prefix(client.signer.public_key)}.{name}"


def deep_submit(depth: int, reply_to: str) -> bytes:
    """A submit envelope whose input nests maps so that the whole is ``depth`` deep."""
    head = msgpack.packb({k: v for k, v in submit_map("deep", reply_to=reply_to).items()
                          if k != "body"})
    body = msgpack.packb({"workflow": "three", "idempotency_key": "deep"})
    # head is a fixmap of 6 entries: make it 7 and append "body": {.., "input": <deep>}.
    return (bytes([head[0] + 1]) + head[1:] + msgpack.packb("body") + bytes([body[0] + 1])
            + body[1:] + msgpack.packb("input") + nested(depth - 3))


async def reply_of(client: ratchet.Client, subject: str, payload: bytes) -> Reply:
    msg = await client.nc.request(subject, payload, timeout=10,
                                  headers=client.sign(subject, payload) or None)
    return Reply.model_validate(msgpack.unpackb(msg.data))


async def dead_letter(client: ratchet.Client, subject: str) -> Msg:
    sub = await client.js.pull_subscribe(subject, "t", stream=STREAM_DLQ)
    [msg] = await sub.fetch(1, timeout=15)  # waits for the dead letter to be published
    return msg


async def nothing_pending(client: ratchet.Client) -> None:
    """Every intake consumer has acked what it got (bounded wait, polled on the server)."""
    async with asyncio.timeout(15):
        while True:
            infos = await client.js.consumers_info(STREAM_SUBMIT)
            if all(i.num_ack_pending == 0 and i.num_pending == 0 for i in infos):
                return
            await asyncio.sleep(0.05)  # polling the server's state, not waiting on a timer


# -- 1. depth -----------------------------------------------------------------------------


def test_decode_refuses_nesting_past_the_limit_without_recursion() -> None:
    assert decode_map(nested(MAX_DEPTH)) is not None
    with pytest.raises(InvalidMessage) as info:
        decode_map(nested(MAX_DEPTH + 1))
    assert info.value.details["limit"] == MAX_DEPTH
    with pytest.raises(InvalidMessage):
        decode_map(nested(1000))  # past msgpack's own limit (1,024) too: still a typed error
    assert decode_map(msgpack.packb({"wide": [[i] for i in range(10_000)]}))


async def test_a_submission_nested_600_deep_is_answered_and_dead_lettered_not_redelivered(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    inbox = await client.nc.subscribe(own_inbox(client, "deep"))
    await client.js.publish("ratchet.submit.acme", deep_submit(600, inbox.subject))
    reply = Reply.model_validate(msgpack.unpackb((await inbox.next_msg(timeout=15)).data))
    assert reply.error is not None and reply.error.code == "INVALID_ARGUMENT"
    assert reply.correlation_id == "c-deep"
    msg = await dead_letter(client, "ratchet.dlq.submit.acme")
    assert msg.headers is not None and msg.headers["Ratchet-Error-Code"] == "INVALID_ARGUMENT"
    await nothing_pending(client)
    api = await reply_of(client, "ratchet.api.acme.submit", deep_submit(600, inbox.subject))
    assert api.error is not None and api.error.code == "INVALID_ARGUMENT"
    assert api.correlation_id == "c-deep"


# -- 2. anything unexpected is dead-lettered after a bounded number of deliveries --------


async def test_a_submission_whose_handling_keeps_raising_is_dead_lettered_with_the_exception(
    start_node: NodeFactory, client: ratchet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_accept = Acceptor.accept

    async def accept(self: Acceptor, tenant: str, env: Envelope) -> Any:
        if env.body.get("idempotency_key") == "boom":
            raise RuntimeError("a bug")
        return await real_accept(self, tenant, env)

    monkeypatch.setattr(Acceptor, "accept", accept)
    monkeypatch.setattr(routing, "GIVE_UP_AFTER", 2)
    node = await start_node()
    inbox = await client.nc.subscribe(own_inbox(client, "boom"))
    await client.js.publish("ratchet.submit.acme",
                            msgpack.packb(submit_map("boom", reply_to=inbox.subject)))
    reply = Reply.model_validate(msgpack.unpackb((await inbox.next_msg(timeout=15)).data))
    assert reply.error is not None and reply.error.code == "INTERNAL"
    assert "RuntimeError('a bug')" in reply.error.message
    await dead_letter(client, "ratchet.dlq.submit.acme")
    assert node.store is not None
    [row] = await node.store.dead_letters()
    assert row["code"] == "INTERNAL" and "RuntimeError" in row["message"]
    await nothing_pending(client)
    task_id = (await client.submit("three", {}, key="after-boom")).task_id
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"


class FakeMsg:
    """What settle_failure uses of a JetStream message."""

    class Metadata:
        def __init__(self, delivered: int) -> None:
            self.num_delivered = delivered

    def __init__(self, delivered: int) -> None:
        self.subject, self.data = "ratchet.decisions.acme", b"\x80"
        self.headers: dict[str, str] | None = None
        self.metadata = self.Metadata(delivered)
        self.settled: list[str] = []

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")


class FakeStore:
    def __init__(self) -> None:
        self.dead: list[dict[str, Any]] = []

    async def record_dead_letter(self, **row: Any) -> None:
        self.dead.append(row)


@pytest.mark.parametrize(("delivered", "settled"), [(1, "nak"), (4, "nak"), (5, "ack")])
async def test_a_router_dead_letters_an_unexpected_exception_at_its_fifth_delivery(
    delivered: int, settled: str
) -> None:
    msg, store = FakeMsg(delivered), FakeStore()
    await routing.settle_failure(msg, RecursionError("too deep"), store=store,  # type: ignore[arg-type]
                                 clock=ratchet.FakeClock(), dlq="ratchet.dlq.decisions.acme",
                                 log=routing.TaskRouter.log)
    assert msg.settled == [settled]
    if settled == "ack":
        [row] = store.dead
        assert row["error"]["code"] == "INTERNAL"
        assert row["error"]["details"]["exception"] == "RecursionError"


# -- 3. strict wire models ----------------------------------------------------------------


@pytest.mark.parametrize("field", ["workflow", "idempotency_key", "type", "message_id"])
async def test_bin_where_a_str_is_expected_fails_validation(
    start_node: NodeFactory, client: ratchet.Client, field: str
) -> None:
    await start_node()
    env = submit_map(f"bin-{field}")
    if field in env["body"]:
        env["body"][field] = env["body"][field].encode()
    else:
        env[field] = env[field].encode()
    reply = await reply_of(client, "ratchet.api.acme.submit", msgpack.packb(env))
    assert reply.error is not None and reply.error.code == "INVALID_ARGUMENT", reply
    assert reply.correlation_id == f"c-bin-{field}"


# -- 4. admin argument types ---------------------------------------------------------------


@pytest.mark.parametrize(("verb", "args"), [
    ("approve", {"approval_id": 5}), ("history", {"limit": 2.5}), ("history", {"limit": 0}),
    ("history", {"limit": 5001}), ("history", {"after": -1}), ("history", {"limit": "2"}),
    ("history", {"limit": True}), ("list", {"limit": 1001}), ("freeze", {"reason": 7}),
    ("restart", {"actor": ["x"]}),
])
async def test_wrong_admin_argument_types_and_out_of_range_values_are_invalid(
    start_node: NodeFactory, client: ratchet.Client, verb: str, args: dict[str, Any]
) -> None:
    await start_node()
    task_id = (await client.submit("three", {}, key="args")).task_id
    await wait_terminal(client, task_id)
    answer = await admin(client, verb, command_id=f"{verb}-{args}", task_id=task_id, args=args,
                         principal={"name": "o", "roles": ["operator", "approver"]})
    assert answer.error is not None and answer.error.code == "INVALID_ARGUMENT", answer


# -- 5. tenant tokens on request subjects -------------------------------------------------


@pytest.mark.parametrize("subject", ["ratchet.admin.tenänt.list", "ratchet.api.tenänt.get"])
async def test_an_invalid_tenant_token_on_a_request_subject_is_invalid(
    start_node: NodeFactory, client: ratchet.Client, subject: str
) -> None:
    await start_node()
    verb = subject.rsplit(".", 1)[1]
    env = Envelope(type=f"admin.{verb}" if ".admin." in subject else "task.get",
                   message_id="m", correlation_id="c",
                   body={"command_id": "c", "principal": {"name": "v", "roles": ["viewer"]}}
                   if ".admin." in subject else {"task_id": "tsk_x"})
    reply = await reply_of(client, subject, encode(env))
    assert reply.error is not None and reply.error.code == "INVALID_ARGUMENT", reply
    assert reply.correlation_id == "c"


# -- 6. replies salvaged from envelopes that do not validate ------------------------------


def test_reply_route_reads_only_valid_values() -> None:
    assert reply_route(msgpack.packb({"reply_to": "_INBOX.a", "correlation_id": "c"})) == (
        "_INBOX.a", "c")
    assert reply_route(msgpack.packb({"reply_to": "a.>", "correlation_id": b"c"})) == (
        None, None)
    assert reply_route(b"\xc1") == (None, None)
    assert reply_route(msgpack.packb([1])) == (None, None)


@pytest.mark.parametrize("override", [{"colour": "red"}, {"schema_version": 2}])
async def test_an_envelope_that_does_not_validate_is_answered_where_it_asks(
    start_node: NodeFactory, client: ratchet.Client, override: dict[str, Any]
) -> None:
    await start_node()
    inbox = await client.nc.subscribe(own_inbox(client, "salvage"))
    raw = msgpack.packb(submit_map("salvage", reply_to=inbox.subject, **override))
    await client.js.publish("ratchet.submit.acme", raw)
    reply = Reply.model_validate(msgpack.unpackb((await inbox.next_msg(timeout=15)).data))
    assert reply.error is not None and reply.error.code == "INVALID_ARGUMENT"
    assert reply.correlation_id == "c-salvage"
    api = await reply_of(client, "ratchet.api.acme.submit", raw)
    assert api.error is not None and api.correlation_id == "c-salvage"
