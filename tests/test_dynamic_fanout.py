"""Map nodes: a fan-out over a list computed at run time — one branch per item, at most
``max_concurrency`` at once, joined like a static fan-out, results in item order; bad lists
(too long, not storable) fail with typed errors before any item runs; a node killed
mid-map runs no finished item again and loses none."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ratchet
from ratchet import JoinPolicy
from ratchet.actors.workflow.map_node import MAX_MAP_ITEMS
from ratchet.protocol.errors import WorkflowDefinitionError
from tests.conftest import NodeFactory, NodeProcess, assert_contiguous, wait_terminal
from tests.dynflow_apps import LIVE, app, fetch


@pytest.fixture(autouse=True)
def _reset_live() -> None:
    LIVE.update(now=0, peak=0)


def types(events: list[ratchet.Event]) -> list[str]:
    return [e.type for e in events]


async def run(client: ratchet.Client, workflow: str, input: dict[str, Any],
              key: str) -> list[ratchet.Event]:
    task_id = (await client.submit(workflow, input, key=key)).task_id
    return await wait_terminal(client, task_id)


# -- definitions ----------------------------------------------------------------------------

async def seed(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize(("options", "message"), [
    ({"max_concurrency": 0}, "max_concurrency must be an int >= 1, got 0"),
    ({"max_items": 0}, f"max_items must be an int from 1 to {MAX_MAP_ITEMS}, got 0"),
    ({"max_items": MAX_MAP_ITEMS + 1}, "max_items must be an int from 1 to"),
    ({"item_timeout": 0}, "item_timeout must be > 0"),
    ({"into": ""}, None),  # the node's name: fine
    ({"policy": JoinPolicy("required", required=frozenset({"0"}))},
     "policy mode is 'all' or 'at_least'"),
    ({"policy": JoinPolicy("all", defaults={"0": None})}, "cannot name items"),
    ({"policy": JoinPolicy("at_least")}, "at_least needs k >= 1"),
])
def test_a_map_is_validated_at_registration(options: dict[str, Any], message: str | None) -> None:
    wf = ratchet.Workflow("bad")
    wf.map("each", items=lambda s: [], branch=fetch, **options)
    if message is None:
        wf.validate()
        return
    with pytest.raises(WorkflowDefinitionError, match=message):
        wf.validate()


def test_a_map_branch_is_an_async_function_or_a_graph_of_steps_choices_and_routes() -> None:
    wf = ratchet.Workflow("bad")

    def sync_fetch(ctx: ratchet.StepContext) -> None:
        return None

    with pytest.raises(WorkflowDefinitionError, match="branch must be an async function"):
        wf.map("each", items=lambda s: [], branch=sync_fetch)  # type: ignore[arg-type]
    parks = ratchet.Workflow("parks")
    parks.approval("human", on_approve="END", on_reject="END", timeout=5, on_timeout="cancel")
    wf.map("each", items=lambda s: [], branch=parks)
    with pytest.raises(WorkflowDefinitionError,
                       match="a branch may hold only steps, choices, routes"):
        wf.validate()


def test_the_transition_table_and_mermaid_show_the_map() -> None:
    flow = app.get("map.all")
    assert flow.transition_table()[1:3] == [
        ("fetch_all", "map", "policy all met (a branch per item, 4 at once)", "summarize"),
        ("fetch_all", "map", "policy failed", "FAILED")]
    assert app.get("map.k").transition_table()[1][2] == "policy at_least 2 met (a branch per item)"
    assert "n1[[fetch_all · map]]" in flow.mermaid()


# -- running ---------------------------------------------------------------------------------

async def test_a_map_runs_one_branch_per_item_and_keeps_their_order(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    urls = [f"u{i}" for i in range(12)]
    events = await run(client, "map.all", {"urls": urls, "sleep": 0.02}, "all")
    assert events[-1].type == "task.succeeded"
    pages = events[-1].payload["output"]["pages"]
    assert pages == [{"item": u, "index": i, "branch": str(i)} for i, u in enumerate(urls)]
    started = next(e for e in events if e.type == "fanout.started")
    assert started.payload["items"] == 12 and started.payload["key"] == "fetch_all#0"
    assert types(events).count("branch.completed") == 12
    assert LIVE["peak"] <= 4  # max_concurrency
    assert_contiguous(events)


async def test_a_map_over_an_empty_list_moves_on_with_an_empty_result(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "map.all", {"urls": []}, "empty")
    assert events[-1].payload["output"] == {"pages": []}
    assert "fanout.started" not in types(events)
    joined = next(e for e in events if e.type == "join.completed")
    assert joined.payload["ok"] is True and joined.payload["succeeded"] == []


async def test_at_least_k_of_a_map_leaves_none_for_the_items_that_did_not_succeed(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(app)
    task_id = (await client.submit("map.k", {"urls": ["a", "b", "c"], "hang": ["c"]}, key="k")).task_id
    events = await wait_terminal(client, task_id)
    pages = events[-1].payload["output"]["pages"]
    assert [p and p["item"] for p in pages] == ["a", "b", None]
    rows = await node.store.branches(task_id, "fetch_all#0")  # type: ignore[union-attr]
    assert rows["2"]["status"] == "CANCELLED"


async def test_an_item_that_fails_fails_a_map_whose_policy_is_all(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "map.all", {"urls": ["a", "b"], "fail": ["b"]}, "fail")
    assert events[-1].type == "task.failed" and events[-1].payload["reason"] == "join failed"
    failed = next(e for e in events if e.type == "join.failed")
    assert failed.payload["failed"] == ["1"]


async def test_an_item_past_its_time_budget_times_out(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "map.timed", {"urls": ["a", "b"], "hang": ["b"]}, "timed")
    assert events[-1].type == "task.failed"
    assert next(e for e in events if e.type == "join.failed").payload["timed_out"] == ["1"]


async def test_a_list_longer_than_max_items_fails_the_task_with_a_typed_error(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "map.bounded", {"urls": list("abcdef")}, "long")
    failed = events[-1]
    assert failed.type == "task.failed" and failed.payload["reason"] == "map has too many items"
    assert failed.payload["error"]["code"] == "INVALID_ARGUMENT"
    assert "returned 6 items, over its max_items of 5" in failed.payload["error"]["message"]
    assert "fanout.started" not in types(events)


async def test_items_that_cannot_be_stored_fail_the_task_before_any_item_runs(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "map.unstorable", {}, "unstorable")
    failed = events[-1]
    assert failed.payload["reason"] == "invalid map item"
    assert failed.payload["error"]["code"] == "INVALID_STATE_VALUE"
    assert failed.payload["error"]["message"].startswith(
        "item 1 of each is not plain data msgpack can encode: a Decimal")
    assert "fanout.started" not in types(events)


async def test_items_that_are_not_a_list_fail_the_task_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "map.listless", {}, "listless")
    failed = events[-1]
    assert failed.payload["reason"] == "items of each raised"
    assert failed.payload["error"]["message"] == "items must return a list or tuple, got NoneType"


async def test_a_map_branch_may_be_a_small_graph(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "map.words", {"words": ["hi", "hello", "hey"]}, "words")
    assert events[-1].payload["output"] == {"shouted": ["HI", "HELLO!", "HEY"]}


@pytest.mark.slow  # a real node process, killed
async def test_a_map_interrupted_by_sigkill_resumes_without_rerunning_finished_items(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    tmp_path: Path,
) -> None:
    log = tmp_path / "items.log"
    node = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(log)},
                        app_spec="tests.dynflow_apps:app")
    await asyncio.to_thread(node.start)
    urls = [f"u{i}" for i in range(40)]
    task_id = (await client.submit("map.all", {"urls": urls, "sleep": 0.05}, key="map-kill")).task_id
    finished_before: set[int] = set()
    async for event in client.watch(task_id):
        if event.type == "branch.completed":
            finished_before.add(int(event.payload["branch"]))
            if len(finished_before) >= 12:
                break
    await asyncio.to_thread(node.kill)
    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id, timeout=60)
    assert_contiguous(events)
    pages = events[-1].payload["output"]["pages"]
    assert [p["item"] for p in pages] == urls  # none lost, in item order
    runs = Counter(int(line.split(":")[1]) for line in log.read_text().splitlines())
    assert sorted(runs) == list(range(40))
    assert all(runs[i] == 1 for i in finished_before), runs  # none checkpointed ran again
    assert max(runs.values()) <= 2  # only the items in flight at the kill ran twice
    completed = [e.payload["branch"] for e in events if e.type == "branch.completed"]
    assert sorted(completed) == sorted(set(completed))  # each item recorded once
    recovered = next(e for e in events if e.type == "task.recovered")
    assert recovered.payload["next_node"] == "fetch_all"
