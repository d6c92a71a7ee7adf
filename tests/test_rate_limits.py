"""Per-tenant submit rate limits at intake: past its rate a tenant is answered RATE_LIMITED
(retryable, with ``retry_after``) on the API and on the JetStream intake alike, where the
refused submission is dead-lettered instead of queueing; other tenants are not slowed."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

import ratchet
from ratchet.protocol.errors import RateLimited
from ratchet.protocol.messages import Reply
from ratchet.supervisors.services.rate_limits import SubmitLimits
from tests.conftest import NodeFactory, node_key, wait_terminal
from tests.test_poison import dead_letter, nothing_pending, own_inbox, submit_map


def test_a_bucket_refuses_past_its_burst_and_refills_at_its_rate() -> None:
    clock = ratchet.FakeClock()
    limits = SubmitLimits(2.0, {"slow": 0.5}, burst=2, now=clock.monotonic)
    limits.take("acme")
    limits.take("acme")
    with pytest.raises(RateLimited) as refused:
        limits.take("acme")
    assert refused.value.retryable and refused.value.retry_after == pytest.approx(0.5)
    assert refused.value.to_wire()["code"] == "RATE_LIMITED"
    assert refused.value.to_wire()["details"]["retry_after"] == 0.5
    limits.take("globex")  # its own bucket
    clock.advance(0.5)
    limits.take("acme")  # one token back after 1 / rate seconds
    limits.take("slow")
    limits.take("slow")
    with pytest.raises(RateLimited) as slow:
        limits.take("slow")
    assert slow.value.retry_after == pytest.approx(2.0)  # its own, slower rate
    unlimited = SubmitLimits(None, now=clock.monotonic)
    for _ in range(1000):
        unlimited.take("acme")
    with pytest.raises(ValueError):
        SubmitLimits(0.0)


async def test_the_api_answers_rate_limited_past_a_tenants_rate_and_serves_other_tenants(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str, tmp_path: Path
) -> None:
    await start_node(submit_rate=0.01, submit_burst=2)
    for key in ("a", "b"):
        await client.submit_sync("three", {}, key)
    with pytest.raises(ratchet.RemoteError) as refused:
        await client.submit_sync("three", {}, "c")
    assert refused.value.code == "RATE_LIMITED" and refused.value.retryable
    assert 99 < refused.value.details["retry_after"] <= 100  # one token every 100 s
    assert refused.value.details["tenant"] == "acme"
    other = await ratchet.Client.connect(nats_url, tenant="globex", creds=node_key(tmp_path))
    try:
        accepted = await other.submit_sync("three", {}, "c")
        assert accepted.accepted is not None and accepted.accepted.created is True
    finally:
        await other.close()


async def test_the_jetstream_intake_answers_and_dead_letters_a_submission_over_the_rate(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(submit_rate=0.01, submit_burst=1)
    first = (await client.submit("three", {}, key="first")).task_id
    assert (await wait_terminal(client, first))[-1].type == "task.succeeded"
    inbox = await client.nc.subscribe(own_inbox(client, "flood"))
    await client.js.publish("ratchet.submit.acme",
                            msgpack.packb(submit_map("second", reply_to=inbox.subject)))
    reply = Reply.model_validate(msgpack.unpackb((await inbox.next_msg(timeout=15)).data))
    assert reply.error is not None and reply.error.code == "RATE_LIMITED"
    assert reply.error.retryable and reply.error.details["retry_after"] > 0
    msg = await dead_letter(client, "ratchet.dlq.submit.acme")
    assert msg.headers is not None and msg.headers["Ratchet-Error-Code"] == "RATE_LIMITED"
    await nothing_pending(client)  # acked: not left in the stream to come back
    assert node.store is not None
    tasks, _ = await node.store.list_tasks("acme")
    assert [t["task_id"] for t in tasks] == [first]
