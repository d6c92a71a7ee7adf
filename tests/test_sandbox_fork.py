"""Sandbox forks (``admin fork --sandbox``): no effect at the provider, events only on
``ratchet.sandbox.events.…``, each tool answered as its ``sandbox=`` declares, recorded
model turns with ``reuse_model``, and the mark durable across a node's restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog

import ratchet
from ratchet.actors.effects.sandbox import Sandbox, plan
from ratchet.actors.transport.subscribed import subscriptions_registered
from ratchet.protocol.errors import ToolDefinitionError
from ratchet.protocol.events import decode_event
from ratchet.protocol.ids import task_id_for
from ratchet.protocol.subjects import STREAM_EVENTS, STREAM_SANDBOX
from ratchet.testing import FinanceClient, FinanceSimulatorProcess
from ratchet.testing.expense import lookup_claim, submit_claim
from tests.conftest import NodeFactory, wait_terminal
from tests.sandbox_apps import (
    MODEL,
    as_sandboxed,
    claim_recorded,
    claim_stubbed,
    lookup_blocked,
    registry,
    stub_claim,
)
from tests.test_admin import OPERATOR, admin


@pytest.fixture
def provider(finance: FinanceClient, simulator: FinanceSimulatorProcess) -> FinanceClient:
    """The finance simulator, reset, and the sandbox apps' tools pointed at it."""
    registry.resources["finance_url"] = simulator.url
    return finance


# -- seeing the subjects ------------------------------------------------------------------


@dataclass
class Seen:
    """Every event on one subject space, by task id."""

    by_task: dict[str, list[ratchet.Event]] = field(default_factory=dict)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def take(self, msg: Any) -> None:
        event = decode_event(msg.data)
        async with self.arrived:
            self.by_task.setdefault(event.task_id, []).append(event)
            self.arrived.notify_all()

    async def until(self, task_id: str, *types: str, timeout: float = 30.0) -> list[ratchet.Event]:
        """The task's events once one of ``types`` arrived (a bounded wait)."""
        def reached() -> bool:
            return any(e.type in types for e in self.by_task.get(task_id, []))
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(reached), timeout)
        return sorted(self.by_task[task_id], key=lambda e: e.sequence)


@dataclass
class Spaces:
    production: Seen
    sandbox: Seen


@pytest.fixture
async def spaces(client: ratchet.Client) -> AsyncIterator[Spaces]:
    """Subscribed, for the whole test, to production's events and to the sandbox's."""
    seen = Spaces(Seen(), Seen())
    subs = [await client.nc.subscribe("ratchet.events.>", cb=seen.production.take),
            await client.nc.subscribe("ratchet.sandbox.events.>", cb=seen.sandbox.take)]
    await subscriptions_registered(client.nc)
    yield seen
    for sub in subs:
        await sub.unsubscribe()


async def _fork(client: ratchet.Client, task_id: str, command_id: str, **args: Any) -> str:
    reply = await admin(client, "fork", command_id=command_id, principal=OPERATOR,
                        task_id=task_id, args={"checkpoint": 0, "sandbox": True, **args})
    assert reply.ok and reply.result is not None, reply.error
    assert reply.result["sandbox"]["source"] == task_id
    return str(reply.result["task_id"])


async def _watched(client: ratchet.Client, task_id: str) -> list[ratchet.Event]:
    """A sandbox fork's events up to its end, through ``Client.watch(sandbox=True)``."""
    events: list[ratchet.Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id, sandbox=True):
            events.append(event)

    await asyncio.wait_for(collect(), 30.0)
    return events


async def _original(client: ratchet.Client, workflow: str, data: dict[str, Any],
                    key: str) -> str:
    task_id = (await client.submit(workflow, data, key=key)).task_id
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    return task_id


# -- declarations and the table (no I/O) --------------------------------------------------


def test_a_sandbox_declaration_is_checked_when_the_tool_is_defined() -> None:
    with pytest.raises(ToolDefinitionError, match="cannot run live"):
        as_sandboxed(submit_claim, "w", "live")
    with pytest.raises(ToolDefinitionError, match="only a write is recorded"):
        as_sandboxed(lookup_claim, "r", "recorded")
    with pytest.raises(ToolDefinitionError, match="stub callable"):
        as_sandboxed(submit_claim, "w", "simulated")


def test_undeclared_reads_run_live_and_undeclared_writes_are_blocked() -> None:
    assert [plan(t) for t in (lookup_claim, submit_claim, claim_stubbed, claim_recorded,
                              lookup_blocked, as_sandboxed(lookup_claim, "r", stub_claim))] == [
        "live", "blocked", "stub", "recorded", "blocked", "stub"]
    assert Sandbox.of("f", None) is None
    assert Sandbox.of("f", {"source": "o", "lineage": ["o", "g"]}) == Sandbox("f", "o",
                                                                               ("o", "g"))


# -- the issue's acceptance test ----------------------------------------------------------


async def test_a_sandbox_fork_has_no_effect_at_the_provider_and_no_event_on_production(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient, spaces: Spaces
) -> None:
    node = await start_node(registry)
    original = await _original(client, "sbx.pay", {"report_id": "p1"}, "p1")
    effects, requests = provider.effects(), provider.requests()
    assert effects == {"claim:p1:travel:submit": 1, "claim:p1:hotel:submit": 1}

    fork = await _fork(client, original, "f-p1")
    events = await spaces.sandbox.until(fork, "task.succeeded", "task.failed")

    assert events[-1].type == "task.succeeded"
    assert (provider.effects(), provider.requests()) == (effects, requests)  # nothing reached it
    answered = {e.payload["tool"]: e.payload for e in events if e.type == "action.sandboxed"}
    assert answered["claim_recorded"]["answer"] == "recorded"
    assert answered["claim_recorded"]["origin"] == original
    assert answered["claim_stubbed"]["answer"] == "stub"
    output = events[-1].payload.get("output") or (await client.get(fork)).output
    assert output is not None and output["hotel"] == "sim-claim:p1:hotel:submit"
    assert output["travel"] == provider.actions()["claim:p1:travel:submit"]["provider_id"]
    # Production saw the original and nothing of the fork; the sandbox saw all of it.
    await client.nc.flush()
    assert fork not in spaces.production.by_task and original in spaces.production.by_task
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    js = client.nc.jetstream()  # and the streams agree: kept apart, not merely unseen
    in_events = await js.stream_info(STREAM_EVENTS, subjects_filter=f"ratchet.events.acme.{fork}.>")
    in_sandbox = await js.stream_info(STREAM_SANDBOX,
                                      subjects_filter=f"ratchet.sandbox.events.acme.{fork}.>")
    assert not in_events.state.subjects
    assert sum((in_sandbox.state.subjects or {}).values()) == len(events)
    # No ledger row of its own: no simulator's answer can ever be "reused" by production.
    assert node.store is not None
    assert await node.store.task_actions(fork) == []
    snapshot = await client.get(fork)
    assert snapshot.sandbox is not None and snapshot.sandbox["source"] == original
    assert (await client.get(original)).sandbox is None


async def test_a_write_with_no_sandbox_declaration_is_blocked_and_the_fork_fails_saying_so(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient, spaces: Spaces
) -> None:
    await start_node(registry)
    original = await _original(client, "sbx.plain", {"report_id": "b1"}, "b1")
    effects, requests = provider.effects(), provider.requests()

    fork = await _fork(client, original, "f-b1")
    events = await spaces.sandbox.until(fork, "task.succeeded", "task.failed")

    assert events[-1].type == "task.failed"
    error = events[-1].payload["error"]
    assert error["type"] == "SandboxBlocked" and error["code"] == "PERMISSION_DENIED"
    assert "submit_claim is a write with no sandbox= declaration" in error["message"]
    [blocked] = [e.payload for e in events if e.type == "action.sandboxed"]
    assert blocked["answer"] == "blocked" and blocked["key"] == "claim:b1:all:submit"
    assert (provider.effects(), provider.requests()) == (effects, requests)


async def test_a_recorded_write_is_blocked_when_the_original_never_made_that_request(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient, spaces: Spaces
) -> None:
    """A fork with another amount asks for another request under the same key: the
    original recorded no answer to it, so the sandbox has none to give."""
    await start_node(registry)
    original = await _original(client, "sbx.pay", {"report_id": "r1"}, "r1")
    effects = provider.effects()

    fork = await _fork(client, original, "f-r1", input={"report_id": "r1", "travel": 99})
    events = await spaces.sandbox.until(fork, "task.succeeded", "task.failed")

    assert events[-1].type == "task.failed"
    assert "recorded another request under key claim:r1:travel:submit" in \
        events[-1].payload["error"]["message"]
    assert provider.effects() == effects


async def test_reads_run_live_in_a_sandbox_unless_declared_blocked(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient, spaces: Spaces
) -> None:
    await start_node(registry)
    original = await _original(client, "sbx.reads", {"key": "k1"}, "rd1")
    queries = provider.requests()["query"]

    live = await _fork(client, original, "f-rd1")
    events = await spaces.sandbox.until(live, "task.succeeded", "task.failed")
    assert events[-1].type == "task.succeeded"
    assert provider.requests()["query"] == queries + 1  # a read: it went to the provider

    blocked = await _fork(client, original, "f-rd2", input={"key": "k1", "blocked": True})
    events = await spaces.sandbox.until(blocked, "task.succeeded", "task.failed")
    assert events[-1].type == "task.failed"
    assert "lookup_blocked is declared blocked" in events[-1].payload["error"]["message"]
    assert provider.requests()["query"] == queries + 1
    assert provider.effects() == {}


async def test_reuse_model_answers_the_agent_from_the_original_turns_and_live_otherwise(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient, spaces: Spaces
) -> None:
    await start_node(registry)
    MODEL.calls = 0
    original = await _original(client, "sbx.agent", {"report_id": "ag"}, "ag1")
    assert MODEL.calls == 2
    effects = provider.effects()

    replayed = await _fork(client, original, "f-ag1", reuse_model=True)
    events = await spaces.sandbox.until(replayed, "task.succeeded", "task.failed")
    assert events[-1].type == "task.succeeded"
    assert MODEL.calls == 2  # every turn answered from the original's recording
    answers = [(e.payload["tool"], e.payload["answer"]) for e in events
               if e.type == "action.sandboxed"]
    assert answers == [("model.clerk", "recorded"), ("claim_recorded", "recorded"),
                       ("model.clerk", "recorded")]

    live = await _fork(client, original, "f-ag2")
    events = await spaces.sandbox.until(live, "task.succeeded", "task.failed")
    assert events[-1].type == "task.succeeded"
    assert MODEL.calls == 4  # no reuse asked: the live model answered both turns
    assert provider.effects() == effects
    assert (await client.get(replayed)).sandbox == {"source": original, "lineage": [original],
                                                    "reuse_model": True}


async def test_an_agents_blocked_call_is_an_error_answer_to_its_model_not_a_failure(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient, spaces: Spaces
) -> None:
    """As every refusal of an agent's proposed call (agents.md): the model reads why."""
    node = await start_node(registry)
    original = await _original(client, "sbx.plain_agent", {}, "ap1")
    effects = provider.effects()

    fork = await _fork(client, original, "f-ap1")
    events = await spaces.sandbox.until(fork, "task.succeeded", "task.failed")

    assert events[-1].type == "task.succeeded"
    [blocked] = [e.payload for e in events if e.type == "action.sandboxed"]
    assert blocked["answer"] == "blocked" and blocked["tool"] == "submit_claim"
    assert node.store is not None
    told = [body for kind, body in await node.store.agent_log(fork, "clerk#0")
            if body.get("role") == "tool"]
    assert told and "submit_claim is a write with no sandbox= declaration" in \
        told[0]["content"] and "PERMISSION_DENIED" in told[0]["content"]
    assert provider.effects() == effects


async def test_reuse_model_without_sandbox_is_refused_and_the_fork_command_is_audited(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient
) -> None:
    node = await start_node(registry)
    original = await _original(client, "sbx.reads", {"key": "k2"}, "rd2")
    refused = await admin(client, "fork", command_id="f-x", principal=OPERATOR,
                          task_id=original, args={"reuse_model": True})
    assert refused.error is not None and refused.error.code == "INVALID_ARGUMENT"
    await _fork(client, original, "f-y")
    assert node.store is not None
    audit = [(e["command_id"], e["outcome"], e["detail"].get("args", {}).get("sandbox"))
             for e in await node.store.audit_log("acme") if e["verb"] == "fork"]
    assert audit == [("f-x", "requested", None), ("f-x", "INVALID_ARGUMENT", None),
                     ("f-y", "requested", True), ("f-y", "ok", None)]


async def test_a_sandbox_forks_fanout_branches_are_answered_by_the_sandbox_too(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient
) -> None:
    await start_node(registry)
    original = await _original(client, "sbx.fanned", {"report_id": "fo"}, "fo1")
    effects, requests = provider.effects(), provider.requests()
    assert effects == {"claim:fo:x:submit": 1, "claim:fo:y:submit": 1}

    fork = await _fork(client, original, "f-fo1")
    events = await _watched(client, fork)  # as `ratchet watch --sandbox` follows it

    assert events[-1].type == "task.succeeded"
    answers = sorted((e.payload["key"], e.payload["answer"]) for e in events
                     if e.type == "action.sandboxed")
    assert answers == [("claim:fo:x:submit", "stub"), ("claim:fo:y:submit", "recorded")]
    assert (provider.effects(), provider.requests()) == (effects, requests)


async def test_a_fork_of_a_sandbox_fork_is_a_sandbox_too(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient, spaces: Spaces
) -> None:
    await start_node(registry)
    original = await _original(client, "sbx.pay", {"report_id": "ff"}, "ff1")
    effects = provider.effects()
    sandbox = await _fork(client, original, "f-ff1")
    await spaces.sandbox.until(sandbox, "task.succeeded", "task.failed")

    again = await admin(client, "fork", command_id="f-ff2", principal=OPERATOR,
                        task_id=sandbox, args={"checkpoint": 0})  # no --sandbox asked
    assert again.ok and again.result is not None
    assert again.result["sandbox"] == {"source": sandbox, "lineage": [sandbox, original],
                                       "reuse_model": False}
    events = await spaces.sandbox.until(again.result["task_id"], "task.succeeded",
                                        "task.failed")
    assert events[-1].type == "task.succeeded"  # the original's recording, two forks back
    assert provider.effects() == effects
    assert again.result["task_id"] not in spaces.production.by_task


def test_the_cli_sends_sandbox_and_reuse_model_as_fork_arguments() -> None:
    from ratchet.supervisors.cli.admin import fork_args
    from ratchet.supervisors.cli.parser import parser

    parsed = parser().parse_args(["admin", "fork", "tsk_1", "--sandbox", "--reuse-model"])
    assert fork_args(parsed) == {"sandbox": True, "reuse_model": True}
    assert fork_args(parser().parse_args(["admin", "fork", "tsk_1"])) == {}
    assert parser().parse_args(["watch", "tsk_1", "--sandbox"]).sandbox is True


def test_the_console_says_a_task_is_a_sandbox_fork_and_of_which_task() -> None:
    from types import SimpleNamespace

    from ratchet.supervisors.console.pages import _summary

    rec = SimpleNamespace(status="RUNNING", tenant="acme", workflow="w", workflow_version=1,
                          current_node="a", version=3, created_at=0.0, updated_at=0.0,
                          deadline_at=None, budget={}, spent={}, error=None, output=None,
                          sandbox={"source": "tsk_<o>"})
    assert "a sandbox fork of tsk_&lt;o&gt;" in _summary(rec, 1.0, None)
    assert "sandbox" not in _summary(SimpleNamespace(**{**vars(rec), "sandbox": None}), 1.0, None)


# -- durable ---------------------------------------------------------------------------


async def test_a_sandbox_fork_is_still_a_sandbox_after_its_node_restarts(
    start_node: NodeFactory, client: ratchet.Client, provider: FinanceClient, spaces: Spaces
) -> None:
    """Parked at an approval, the node stopped and another started on the same store: the
    fork resumes from its row, its write still simulated, its events and its log lines
    still the sandbox's."""
    node = await start_node(registry)
    original = task_id_for("acme", "pk1")
    await client.submit("sbx.parked", {"report_id": "pk1"}, key="pk1")
    asked = await spaces.production.until(original, "approval.requested")
    approval = next(e for e in asked if e.type == "approval.requested").payload
    assert (await admin(client, "approve", command_id="a-pk1", principal=OPERATOR,
                        task_id=original, args={"approval_id": approval["approval_id"]})).ok
    await spaces.production.until(original, "task.succeeded")
    effects, requests = provider.effects(), provider.requests()

    fork = await _fork(client, original, "f-pk1")
    asked = await spaces.sandbox.until(fork, "approval.requested")
    await node.stop()
    await start_node(registry)
    with structlog.testing.capture_logs(
            processors=[structlog.contextvars.merge_contextvars]) as logs:
        approval = next(e for e in asked if e.type == "approval.requested").payload
        assert (await admin(client, "approve", command_id="a-fpk1", principal=OPERATOR,
                            task_id=fork, args={"approval_id": approval["approval_id"]})).ok
        events = await spaces.sandbox.until(fork, "task.succeeded", "task.failed")

    assert events[-1].type == "task.succeeded"
    assert [e.payload["answer"] for e in events if e.type == "action.sandboxed"] == [
        "recorded", "stub"]
    assert (provider.effects(), provider.requests()) == (effects, requests)
    assert fork not in spaces.production.by_task
    filed = [e for e in logs if e.get("event") == "second claim filed"]
    assert filed and all(e.get("sandbox") is True and e.get("sandbox_of") == original
                         for e in filed)
    assert (await client.get(fork)).sandbox is not None
