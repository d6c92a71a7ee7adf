"""A partition's mail router does not hold every task's mail behind one task's long step
(supervisors/services/routing.py). An actor answers mail between steps, so mail for a task
whose step runs long is answered when the step ends; the router used to fetch its next
batch only once the whole batch was answered, so a task of the same partition submitted
meanwhile did not start until the long step ended — seen as issue 19's "lost first
delivery": a tool call held back by a neighbour's 30-second tool call."""

from __future__ import annotations

import asyncio
from typing import Any

import ratchet
from ratchet.protocol.codec import encode
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.messages import Envelope, StartTask
from ratchet.protocol.subjects import STREAM_MAIL, mail_subject, partition_of
from tests.conftest import NodeFactory
from tests.keys import publish_sealed

entered, release = asyncio.Event(), asyncio.Event()

hold = ratchet.Workflow("hol.hold", version=1)


@hold.step
async def wait_for_release(ctx: ratchet.StepContext) -> dict[str, Any]:
    entered.set()
    await release.wait()
    return {"output": {"held": True}}


quick = ratchet.Workflow("hol.quick", version=1)


@quick.step
async def at_once(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"quick": True}}


app = ratchet.Registry([hold, quick])


async def test_a_long_step_does_not_hold_up_its_partitions_other_tasks(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    entered.clear()
    release.clear()
    node = await start_node(app)
    held_id = task_id_for("acme", "held")
    partition = partition_of(held_id)
    # A key whose task shares the held task's partition (so its mail router).
    key = next(k for k in (f"quick-{i}" for i in range(1000))
               if partition_of(task_id_for("acme", k)) == partition)
    held = await client.submit("hol.hold", {}, key="held")
    await asyncio.wait_for(entered.wait(), 30)
    # Mail to the held task (a repeated start, as a redelivery would be) is answered only
    # when its step ends: the router holds it in progress.
    env = Envelope(type="task.start", message_id=new_id("msg"), correlation_id="x",
                   body=StartTask(task_id=held_id, tenant="acme").model_dump())
    await publish_sealed(client, node, mail_subject(held_id, "task"), encode(env))
    assert node.bus is not None

    async def router_holds_it() -> None:
        while (await node.bus.js.consumer_info(  # noqa: ASYNC110 - JetStream's state has
                STREAM_MAIL, f"mail-{partition}")).num_ack_pending < 1:  # no event; bounded
            await asyncio.sleep(0.05)

    await asyncio.wait_for(router_holds_it(), 30)
    try:
        # The neighbour starts and finishes while the held step still runs.
        other = await client.submit("hol.quick", {}, key=key)
        assert await other.result(timeout=15) == {"quick": True}
        assert not release.is_set()
    finally:
        release.set()
    assert await held.result(timeout=30) == {"held": True}
