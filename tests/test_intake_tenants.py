"""A new tenant's first JetStream submission is taken as it comes, not at the intake's next
scan of the stream: the node starts the tenant's consumer loop when it sees the message
(supervisors/services/intake.py). The scan is set to an hour here, so only that path can
accept the submissions within the test's bound."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import ratchet
from ratchet.actors.transport.bus import Bus
from tests.conftest import NodeFactory, wait_terminal

#: Longer than any test: the backstop scan never runs after the node's first one.
AN_HOUR = 3600.0


async def test_a_new_tenants_first_submission_is_accepted_without_waiting_for_a_scan(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(intake_rescan_interval=AN_HOUR)
    newcomer = ratchet.Client(client.nc, "newcomer", client.signer)  # no submit seen yet

    task_id = (await newcomer.submit("three", {}, key="first")).task_id
    events = await wait_terminal(newcomer, task_id, timeout=20.0)

    assert [e.type for e in events][:2] == ["task.queued", "task.started"]
    assert events[-1].type == "task.succeeded"


async def test_tenants_arriving_together_each_get_their_own_consumer(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(intake_rescan_interval=AN_HOUR)
    tenants = [ratchet.Client(client.nc, f"t{i}", client.signer) for i in range(5)]

    handles = await asyncio.gather(*(t.submit("three", {}, key="k") for t in tenants))
    task_ids = [h.task_id for h in handles]
    finished = await asyncio.gather(*(wait_terminal(t, task_id, timeout=20.0)
                                      for t, task_id in zip(tenants, task_ids, strict=True)))

    assert all(events[-1].type == "task.succeeded" for events in finished)
    consumers = {info.name for info in await client.js.consumers_info("RATCHET_SUBMIT")}
    assert {f"intake-t{i}" for i in range(5)} <= consumers


async def test_a_tenants_loop_that_fails_starts_again_without_waiting_for_a_scan(
        start_node: NodeFactory, client: ratchet.Client,
        monkeypatch: pytest.MonkeyPatch) -> None:
    failed: list[str] = []
    pull_loop = Bus.pull_loop

    async def failing_once(self: Bus, stream: str, durable: str, filter_subject: str,
                           *args: Any, **kwargs: Any) -> None:
        if "newcomer" in filter_subject and not failed:
            failed.append(filter_subject)
            raise RuntimeError("consumer create refused (injected)")
        await pull_loop(self, stream, durable, filter_subject, *args, **kwargs)

    monkeypatch.setattr(Bus, "pull_loop", failing_once)
    await start_node(intake_rescan_interval=AN_HOUR)
    newcomer = ratchet.Client(client.nc, "newcomer", client.signer)

    task_id = (await newcomer.submit("three", {}, key="first")).task_id
    events = await wait_terminal(newcomer, task_id, timeout=20.0)

    assert failed == ["ratchet.submit.newcomer"]
    assert events[-1].type == "task.succeeded"
