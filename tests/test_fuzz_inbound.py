"""Fuzzing every inbound handler of a real node (issue 17): random msgpack, random bytes and
random mutations of valid messages on the submit, decision, external and mail streams and
the API and admin subjects. Each message must be processed or answered / dead-lettered
with a typed error, nothing may be left unacked or redelivered for ever, and the node must
keep serving.

Hypothesis generates the payloads (a sync property that collects them); the async test
then sends them all to one node — a node per example would cost a second each.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ratchet
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import ErrorCode
from ratchet.protocol.messages import Envelope, Reply
from ratchet.protocol.subjects import (
    STREAM_DECISIONS,
    STREAM_EXTERNAL,
    STREAM_MAIL,
    STREAM_SUBMIT,
    mail_subject,
)
from tests.conftest import NodeFactory, wait_terminal
from tests.keys import publish_sealed

EXAMPLES = 60
CODES = {code.value for code in ErrorCode}

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
           | st.text(max_size=20) | st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                      max_leaves=12)


def valid(kind: str, n: int) -> dict[str, Any]:
    """A valid message of each kind (the seed of the mutations)."""
    body: dict[str, Any] = {
        "submit": {"workflow": "three", "idempotency_key": f"fuzz-{n}", "input": {"x": n}},
        "get": {"task_id": "tsk_nope"},
        "admin": {"command_id": f"cmd-{n}", "principal": {"name": "v", "roles": ["viewer"]},
                  "args": {"limit": 5}},
        "decision": {"task_id": "tsk_nope", "approval_id": "apr_1", "decision": "approve",
                     "decided_by": "d"},
        "external": {"correlation_id": f"corr-{n}", "outcome": "completed", "result": {}},
        "mail": {"task_id": "tsk_nope", "tenant": "acme"},
    }[kind]
    types = {"submit": "task.submit", "get": "task.get", "admin": "admin.list",
             "decision": "approval.decision", "external": "external.resolved",
             "mail": "task.start"}
    return {"schema_version": 1, "type": types[kind], "message_id": f"m-{kind}-{n}",
            "correlation_id": f"c-{kind}-{n}", "body": body}


@st.composite
def mutated(draw: st.DrawFn, kind: str) -> bytes:
    """A valid message with one key of the envelope or its body replaced, removed or added."""
    message = valid(kind, draw(st.integers(0, 10**6)))
    target = draw(st.sampled_from([message, message["body"]]))
    key = draw(st.sampled_from([*target, "extra"]))
    if draw(st.booleans()) and key in target:
        del target[key]
    else:
        target[key] = draw(values)
    return msgpack.packb(message, use_bin_type=True)  # type: ignore[no-any-return]


@st.composite
def deep(draw: st.DrawFn, kind: str) -> bytes:
    """A valid message with a map nested up to 1,100 deep in its body, where the body
    takes a map (built by hand: msgpack's packer stops at 511 levels)."""
    message = valid(kind, draw(st.integers(0, 10**6)))
    where = {"submit": "input", "admin": "args", "external": "result"}.get(kind, "deep")
    message["body"][where] = "\x00deep\x00"
    depth = draw(st.sampled_from([64, 65, 600, 1000]) | st.integers(1, 1100))
    nested = b"\x81\xa1a" * (depth - 1) + b"\x80"
    return msgpack.packb(message).replace(msgpack.packb("\x00deep\x00"), nested)  # type: ignore[no-any-return]


def payloads(kind: str) -> list[bytes]:
    """EXAMPLES payloads for one handler: random bytes, random msgpack, mutations of a
    valid message, valid messages nested too deep."""
    found: list[bytes] = []
    anything = (st.binary(max_size=64) | values.map(lambda v: msgpack.packb(v, use_bin_type=True))
                | mutated(kind) | mutated(kind) | deep(kind))

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(anything)
    def collect(payload: bytes) -> None:
        found.append(payload)

    collect()
    return found


async def request(client: ratchet.Client, subject: str, payload: bytes) -> Reply:
    # Signed (docs/security.md): the fuzz is of what a holder of a valid key may send.
    msg = await client.nc.request(subject, payload, timeout=20,
                                  headers=client.sign(subject, payload))
    reply = Reply.model_validate(msgpack.unpackb(msg.data))
    assert reply.ok or (reply.error is not None and reply.error.code in CODES), reply
    return reply


async def settled(client: ratchet.Client) -> None:
    """Every consumer of the work-queue streams has acked all it got (bounded wait: the
    slowest path is a confirmation nak'ed up to its 5th delivery, about 7.5 s)."""
    async with asyncio.timeout(60):
        while True:
            busy = [(i.name, i.num_ack_pending, i.num_pending)
                    for stream in (STREAM_SUBMIT, STREAM_DECISIONS, STREAM_EXTERNAL, STREAM_MAIL)
                    for i in await client.js.consumers_info(stream)
                    if i.num_ack_pending or i.num_pending]
            if not busy:
                return
            await asyncio.sleep(0.2)  # polling the server's consumer state, not a timer


async def test_every_inbound_handler_answers_or_dead_letters_random_input_and_keeps_serving(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    streams = {"submit": "ratchet.submit.acme", "decision": "ratchet.decisions.acme",
               "external": "ratchet.external.acme",
               "mail": mail_subject("tsk_nope", "task")}
    for kind, subject in streams.items():
        for payload in payloads(kind):
            if kind in ("decision", "external"):
                await client.publish_signed(subject, payload)
            elif kind == "mail":  # sealed, as a node's: the fuzz reaches the handlers
                await publish_sealed(client, node, subject, payload)
            else:
                await client.js.publish(subject, payload)
    requests = [("ratchet.api.acme.submit", p) for p in payloads("submit")]
    requests += [("ratchet.api.acme.get", p) for p in payloads("get")]
    requests += [("ratchet.admin.acme.list", p) for p in payloads("admin")]
    await asyncio.gather(*(request(client, s, p) for s, p in requests))
    await settled(client)
    assert node.store is not None
    for row in await node.store.dead_letters():
        assert row["code"] in CODES, row
    task_id = (await client.submit("three", {}, key="after-the-fuzz")).task_id
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    listed = await request(client, "ratchet.admin.acme.list", encode(Envelope(
        type="admin.list", message_id="m", correlation_id="c", body=valid("admin", -1)["body"])))
    assert listed.ok
