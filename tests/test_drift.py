"""Drift reconciliation: a workflow's ``Reconcile(every, check)`` compares, periodically and
durably, the ledger's record of what its tasks made with the provider's view, and records
a ``drift.detected`` event (and a warning) on the task whose object drifted; the ledger
itself is never changed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import ratchet
from ratchet.actors.workflow.reconcile import difference
from ratchet.protocol.subjects import partition_of
from tests.conftest import NodeFactory, wait_terminal

#: The provider's objects: what it holds now, whatever Ratchet recorded.
PROVIDER: dict[str, dict[str, Any]] = {}
ASKED: list[str] = []


class File(BaseModel):
    claim: str
    amount: int


class Filed(BaseModel):
    claim: str
    amount: int
    status: str


async def _file(ctx: ratchet.ToolContext, args: File) -> Filed:
    PROVIDER[args.claim] = {"claim": args.claim, "amount": args.amount, "status": "filed"}
    return Filed(**PROVIDER[args.claim])


file_claim = ratchet.tool(kind="write", args=File, result=Filed,
                          key=lambda a: f"claim:{a.claim}", name="file_claim")(_file)


def claim_now(effect: ratchet.RecordedEffect) -> dict[str, Any] | None:
    """The provider's view of one claim (a sync check: it runs on a thread)."""
    ASKED.append(effect.key)
    if effect.result["claim"] == "broken":
        raise ConnectionError("provider down")
    return PROVIDER.get(effect.result["claim"])


def claims() -> ratchet.Workflow:
    wf = ratchet.Workflow("claims", reconcile=ratchet.Reconcile(every=10, check=claim_now,
                                                                  tools=("file_claim",)))

    @wf.step
    async def file(ctx: ratchet.StepContext) -> dict[str, Any]:
        filed = await ctx.call(file_claim, File(claim=ctx.input["claim"], amount=10))
        return {"output": filed.model_dump()}

    return wf


async def drift_events(client: ratchet.Client, task_id: str, count: int) -> list[ratchet.Event]:
    """The task's first ``count`` drift.detected events (bounded wait, past its end)."""
    found: list[ratchet.Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id, follow_terminal=True):
            if event.type == "drift.detected":
                found.append(event)
                if len(found) == count:
                    return

    await asyncio.wait_for(collect(), 15)
    return found


async def test_a_reconcile_pass_records_drift_on_the_task_that_made_the_object(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    PROVIDER.clear()
    ASKED.clear()
    clock = ratchet.FakeClock()
    node = await start_node(ratchet.Registry([claims()]), clock=clock)
    ids = {}
    for claim in ("changed", "gone", "same", "broken"):
        ids[claim] = (await client.submit("claims", {"claim": claim}, key=claim)).task_id
        assert (await wait_terminal(client, ids[claim]))[-1].type == "task.succeeded"
    PROVIDER["changed"]["amount"] = 12  # edited at the provider, behind Ratchet's back
    del PROVIDER["gone"]
    clock.advance(10)  # the first pass is due
    [changed] = await drift_events(client, ids["changed"], 1)
    assert changed.payload["difference"] == {"amount": {"recorded": 10, "provider": 12}}
    assert changed.payload["key"] == "claim:changed" and changed.payload["tool"] == "file_claim"
    [gone] = await drift_events(client, ids["gone"], 1)
    assert gone.payload["difference"] == {"value": {
        "recorded": {"claim": "gone", "amount": 10, "status": "filed"}, "provider": None}}
    assert node.store is not None
    for claim in ("same", "broken"):  # in agreement; no answer (not drift)
        assert not [e for e in await node.store.events(ids[claim])
                    if e["type"] == "drift.detected"]
    assert sorted(ASKED) == ["claim:broken", "claim:changed", "claim:gone", "claim:same"]
    # The ledger still says what Ratchet did; the task's status and version did not move.
    action = await node.store.get_action("acme", "claim:changed")
    assert action is not None and action.result["amount"] == 10
    snapshot = await client.get(ids["changed"])
    assert snapshot.status == "SUCCEEDED"
    assert snapshot.version == (await node.store.load_task(ids["changed"])).version
    # The pass is recorded: not due again until `every` later, on any node.
    partition = partition_of(ids["changed"], node.config.partitions)
    due = await node.store.reconcile_due("claims", partition, first_at=0.0)
    assert due == pytest.approx(clock.due_now() + 10)


def test_difference_names_the_fields_that_differ_or_the_whole_value() -> None:
    assert difference({"a": 1, "b": 2}, {"a": 1, "b": 2}) == {}
    assert difference({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == {
        "b": {"recorded": 2, "provider": 3}, "c": {"recorded": None, "provider": 4}}
    assert difference("x", "y") == {"value": {"recorded": "x", "provider": "y"}}
    assert difference({"a": 1}, None) == {"value": {"recorded": {"a": 1}, "provider": None}}


def test_a_reconcile_job_is_checked_when_it_is_declared() -> None:
    with pytest.raises(ratchet.WorkflowDefinitionError, match="every must be >= 1"):
        ratchet.Reconcile(every=0, check=claim_now)
    with pytest.raises(ratchet.WorkflowDefinitionError, match="check must be callable"):
        ratchet.Reconcile(every=60, check="claim_now")  # type: ignore[arg-type]
