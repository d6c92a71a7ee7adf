"""Agent nodes: a scripted model drives the tool loop; the runtime validates, budgets,
detects loops and records every turn so a resumed task never asks again."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ratchet
from tests.agent_apps import app, happy, sloppy
from tests.conftest import NodeFactory, NodeProcess, assert_contiguous, wait_terminal


def types(events: list[ratchet.Event]) -> list[str]:
    return [e.type for e in events]


async def run(client: ratchet.Client, workflow: str, key: str, **submit: Any) -> list[ratchet.Event]:
    task_id = (await client.submit(workflow, {"category": "travel"}, key=key, **submit)).task_id
    events = await wait_terminal(client, task_id)
    assert_contiguous(events)
    return events


async def test_a_scripted_model_runs_a_multi_turn_tool_loop_to_a_validated_answer(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(app)
    events = await run(client, "agent.happy", "happy")
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"category": "meals", "limit": 100.0}
    turns = [e.payload for e in events if e.type == "agent.turn"]
    assert [t["tool_calls"] for t in turns] == [["lookup_policy"], ["lookup_policy"]]
    answered = next(e for e in events if e.type == "agent.answered")
    assert answered.payload["model"] == "scripted-1" and answered.payload["version"] == "1"
    # every model call is a recorded action: model, request hash and answer in the ledger
    actions = await node.store.task_actions(events[0].task_id)  # type: ignore[union-attr]
    assert [a.tool for a in actions] == ["model.assistant"] * 3
    assert all(a.status == "SUCCEEDED" and a.request_hash for a in actions)
    snapshot = await node.store.load_task(events[0].task_id)  # type: ignore[union-attr]
    assert snapshot.spent == {"tokens": 45, "model_calls": 3, "money": 0.0, "tool_calls": 2}


async def test_unknown_tools_and_bad_arguments_are_fed_back_not_raised(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(app)
    events = await run(client, "agent.sloppy", "sloppy")
    assert events[-1].type == "task.succeeded"
    log = await node.store.agent_log(events[0].task_id, "assistant#0")  # type: ignore[union-attr]
    tool_replies = [m["content"] for kind, m in log if kind == "message" and m["role"] == "tool"]
    assert "unknown tool 'delete_everything'" in tool_replies[0]
    assert "invalid arguments for lookup_policy" in tool_replies[1]
    assert json.loads(tool_replies[2]) == {"category": "travel", "limit": 500.0}
    assert "agent.repair" in types(events)  # "the limit is 500" was not the JSON required


async def test_an_answer_that_never_validates_fails_after_its_repairs(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "agent.stubborn", "stubborn")
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "agent answer invalid"
    assert types(events).count("agent.repair") == 2


async def test_each_budget_dimension_ends_the_node_with_a_routable_outcome(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    cases = {"tokens": {"tokens": 30}, "model_calls": {"model_calls": 2},
             "tool_calls": {"tool_calls": 1}, "money": {"money": 1.0}}
    for dim, budget in cases.items():
        events = await run(client, "agent.spender", f"budget-{dim}", budget=budget)
        exhausted = next(e for e in events if e.type == "agent.budget_exhausted")
        assert exhausted.payload["dimension"] == dim
        assert exhausted.payload["to"] == "fallback"
        assert events[-1].payload["output"] == {"fallback": True}


async def test_the_wall_time_budget_reads_the_injected_clock(
    start_node: NodeFactory, client: ratchet.Client, monkeypatch: Any
) -> None:
    monkeypatch.setenv("RATCHET_TEST_TOOL_DELAY", "0.05")  # turns slower than the test
    clock = ratchet.FakeClock()
    await start_node(app, clock=clock)
    task_id = (await client.submit("agent.spender", {}, key="wall", budget={"wall_time_s": 60})).task_id
    async for event in client.watch(task_id):
        if event.type == "agent.turn":
            break
    clock.advance(61.0)  # the next turn finds the budget spent
    events = await wait_terminal(client, task_id)
    exhausted = next(e for e in events if e.type == "agent.budget_exhausted")
    assert exhausted.payload["dimension"] == "wall_time_s"


async def test_a_model_repeating_itself_gets_one_intervention_then_is_stopped(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "agent.repeat", "repeat")
    assert types(events).count("agent.intervention") == 1
    stopped = next(e for e in events if e.type == "agent.loop_detected")
    assert stopped.payload["pattern"] == "no_progress"
    assert stopped.payload["history"]  # the evidence: fingerprints and calls
    assert events[-1].type == "task.failed"
    assert events[-1].payload["error"]["code"] == "LOOP_DETECTED"


async def test_abab_tool_alternation_is_detected(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "agent.alternate", "abab")
    stopped = next(e for e in events if e.type == "agent.loop_detected")
    assert stopped.payload["pattern"] == "alternation"
    sequence = stopped.payload["sequence"]
    assert set(sequence) == {"lookup_policy", "lookup_rate"}
    assert all(a != b for a, b in itertools.pairwise(sequence))


async def test_an_oscillating_observed_field_is_detected(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    events = await run(client, "agent.oscillate", "flip")
    stopped = next(e for e in events if e.type == "agent.loop_detected")
    assert stopped.payload["pattern"] == "oscillation"
    assert set(stopped.payload["values"]) == {"open", "closed"}


def test_agent_nodes_export_their_outcomes() -> None:
    rows = happy.transition_table()
    assert ("assistant", "agent", "answer validated", "done") in rows
    assert ("assistant", "agent", "loop detected", "FAILED") in rows
    assert sloppy.node("assistant").kind == "agent"


@pytest.mark.slow
async def test_a_node_killed_mid_conversation_resumes_it_without_asking_again(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    tmp_path: Path,
) -> None:
    log = tmp_path / "model.log"
    node = node_process(nats_url, {"RATCHET_TEST_MODEL_LOG": str(log),
                                   "RATCHET_TEST_TOOL_DELAY": "0.1"},
                        app_spec="tests.agent_apps:app")
    await asyncio.to_thread(node.start)
    task_id = (await client.submit("agent.slow", {}, key="slow")).task_id
    turns = 0
    async for event in client.watch(task_id):
        if event.type == "agent.turn":
            turns += 1
            if turns == 2:
                break
    await asyncio.to_thread(node.kill)
    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id, timeout=60)
    assert events[-1].type == "task.succeeded"
    asked = Counter(int(line) for line in log.read_text().split())
    assert asked[0] == 1 and asked[1] == 1, asked  # recorded turns are never asked again
    assert all(n <= 2 for n in asked.values()) and sorted(asked) == [0, 1, 2, 3, 4, 5]
    recorded = [e.payload["turn"] for e in events if e.type == "agent.turn"]
    assert recorded == [0, 1, 2, 3, 4]  # one continuous conversation


async def test_an_agent_talks_to_an_openai_compatible_endpoint_with_retries(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from ratchet.actors.agents.openai_model import OpenAICompatibleModel
    from ratchet.testing.model_stub_process import ModelStubProcess
    from tests.agent_apps import agent_workflow

    with ModelStubProcess() as stub:
        stub.script([{"tool_calls": [{"name": "lookup_policy",
                                      "arguments": {"category": "travel"}}]},
                     {"content": json.dumps({"category": "travel", "limit": 500.0})}])
        stub.faults([{"mode": "status_429", "retry_after": 0.05}, {"mode": "status_500"},
                     {"mode": "malformed_json"}])
        model = OpenAICompatibleModel(stub.url, "gpt-test", api_key="sk-secret", timeout=5)
        registry = ratchet.Registry([agent_workflow("agent.http", model)])
        await start_node(registry)
        events = await run(client, "agent.http", "http")
        assert events[-1].type == "task.succeeded"
        assert events[-1].payload["output"] == {"category": "travel", "limit": 500.0}
        retries = [e.payload["reason"] for e in events if e.type == "action.retry"]
        assert retries == ["retry_after", "backoff", "backoff"]
        sent = stub.requests()
        assert all(r["authorized"] for r in sent)
        assert sent[-1]["body"]["messages"][-1]["role"] == "tool"
        assert all("sk-secret" not in json.dumps(e.payload) for e in events)
