"""``admin diagnose`` / ``ratchet diagnose``: why a task is where it is, and the heartbeats a
long step sends from inside (``ctx.heartbeat``) without a checkpoint."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from rich.console import Console

import ratchet
from ratchet.actors.task.diagnosis import age, diagnose
from ratchet.actors.task.heartbeat import StepHeartbeat, fraction_of, task_percent
from ratchet.persistence.ledger import ActionRecord
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.ids import task_id_for
from ratchet.supervisors.cli.render import render_answer
from tests.conftest import NodeFactory, wait_terminal
from tests.graph_apps import approve
from tests.test_admin import admin
from tests.test_trust_internal import app as shipping_app

# -- the verdict, from rows (no I/O) -------------------------------------------------------

NOW = 1_000_000.0


@dataclass
class Rec:
    status: str
    task_id: str = "t_1"
    tenant: str = "acme"
    workflow: str = "claims"
    workflow_version: int = 1
    current_node: str | None = "submit"
    next_step: int = 2
    steps_total: int | None = 4
    step_failures: int = 0
    budget: dict[str, Any] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=dict)
    deadline_at: float | None = None
    created_at: float = NOW - 86400
    updated_at: float = NOW - 60
    error: dict[str, Any] | None = None
    control: dict[str, Any] = field(default_factory=dict)


def rows(**kinds: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"timers": [], "waits": [], "approvals": [], "actions": [],
                           "events": [], "branches": [], "heartbeats": [],
                           "lease": {"partition": 3, "owner": "n1", "token": 7,
                                     "owner_status": "active",
                                     "owner_heartbeat_at": NOW - 2}}
    out.update(kinds)
    return out


def action(key: str, status: str, *, accepted: bool = False, provider_id: str | None = None,
           updated_at: float = NOW - 3 * 3600, next_attempt_at: float | None = None,
           attempts: int = 1) -> ActionRecord:
    return ActionRecord(tenant="acme", key=key, task_id="t_1", step_index=1, tool="claims.submit",
                        kind="write", request_hash="sha256:ab", args={}, status=status,
                        attempts=attempts, accepted=accepted, result=None, error=None,
                        provider_id=provider_id, compensates=None, seq=1,
                        created_at=updated_at, updated_at=updated_at,
                        next_attempt_at=next_attempt_at)


def test_a_task_waiting_for_a_providers_confirmation_says_so_and_when_its_timer_fires() -> None:
    rec = Rec("WAITING_EXTERNAL")
    report = diagnose(rec, rows(
        actions=[action("claim:X:submit", "IN_FLIGHT", accepted=True, provider_id="prov-9")],
        waits=[{"correlation_id": "claim:X:submit", "kind": "action", "since": NOW - 3 * 3600}],
        timers=[{"timer_id": "tm", "kind": "wait_timeout", "due_at": NOW + 21 * 3600,
                 "payload": {}}]), NOW)
    assert report["verdict"] == ("waiting for provider confirmation of claim:X:submit (provider"
                                 " id prov-9) for 3 h; wait_timeout timer fires in 21 h")
    [unsettled] = report["unsettled_actions"]
    assert unsettled["provider_id"] == "prov-9" and unsettled["for_s"] == 3 * 3600
    assert report["lease"]["owner_heartbeat_age_s"] == 2


def test_an_unknown_outcome_an_approval_and_a_silent_owner_each_get_their_verdict() -> None:
    unknown = diagnose(Rec("UNKNOWN"), rows(actions=[action("pay:1", "UNKNOWN")]), NOW)
    assert unknown["verdict"].startswith("outcome of claims.submit pay:1 unknown for 3 h")
    waiting = diagnose(Rec("WAITING_APPROVAL"), rows(approvals=[{
        "approval_id": "apr_1", "node": "manager", "request_hash": "h", "approvers": "m",
        "expires_at": NOW + 3600, "since": NOW - 600}]), NOW)
    assert waiting["verdict"] == "waiting for approval apr_1 at manager for 10 min; expires in 1 h"
    silent = rows()
    silent["lease"]["owner_heartbeat_at"] = NOW - 300
    stuck = diagnose(Rec("RUNNING", step_failures=2, deadline_at=NOW + 7200), silent, NOW)
    assert "on n1, silent for 5 min" in stuck["verdict"]
    assert "step failed 2 time(s)" in stuck["verdict"] and "deadline in 2 h" in stuck["verdict"]
    assert stuck["step"] == {"index": 2, "attempt": 3, "failures": 2}
    orphan = rows(lease={"partition": 3, "owner": None})
    assert "no node holds partition 3" in diagnose(Rec("QUEUED"), orphan, NOW)["verdict"]


def test_since_when_comes_from_the_event_that_entered_the_status_and_budget_left_is_counted(
) -> None:
    events = [{"sequence": 5, "type": "task.started", "at": NOW - 500, "payload": {}},
              {"sequence": 9, "type": "step.failed", "at": NOW - 100,
               "payload": {"attempt": 1, "error": {"code": "X", "message": "boom"}}},
              {"sequence": 10, "type": "task.recovered", "at": NOW - 90, "payload": {"n": 1}}]
    report = diagnose(Rec("RUNNING", budget={"tokens": 1000, "deadline_s": 60},
                          spent={"tokens": 250.0}), rows(events=events), NOW)
    assert report["since"] == NOW - 90 and report["for_s"] == 90  # recovered: running again
    assert report["retries"] == [{"at": NOW - 100, "type": "step.failed", "error": "boom",
                                  "attempt": 1, "tool": None}]
    assert [r["type"] for r in report["recovery"]] == ["task.recovered"]
    assert report["budget"]["tokens"] == {"limit": 1000, "spent": 250.0, "left": 750.0}


def test_progress_weighs_the_running_step_by_its_heartbeat_and_counts_fan_out_branches() -> None:
    assert task_percent(2, 4, 0.5) == 62
    assert task_percent(2, 4, None, [1.0, 0.5, 0.0, 0.5]) == 62  # mean of four branches
    assert task_percent(4, 4, 1.0) == 99  # 100 only once finished
    assert task_percent(1, None, 0.5) == 0
    assert fraction_of((3, 12)) == 0.25 and fraction_of(0.4) == 0.4 and fraction_of(None) is None
    for bad in (1.5, -0.1, (1, 0), True):
        with pytest.raises(InvalidMessage):
            fraction_of(bad)
    beats = rows(
        heartbeats=[{"scope": "b", "step": "work", "attempt": 1, "fraction": 0.5, "note": None,
                     "owner": "n1", "at": NOW - 1}],
        branches=[{"node": "fan#1", "branch": "a", "status": "FAILED", "started_at": NOW,
                   "finished_at": NOW},  # an earlier visit of the fan-out: not counted
                  {"node": "fan#2", "branch": "a", "status": "SUCCEEDED", "started_at": NOW,
                   "finished_at": NOW},
                  {"node": "fan#2", "branch": "b", "status": "RUNNING", "started_at": NOW,
                   "finished_at": None},
                  {"node": "fan#2", "branch": "c", "status": "RUNNING", "started_at": NOW,
                   "finished_at": None}])
    progress = diagnose(Rec("RUNNING", current_node="fan", next_step=1, steps_total=3), beats,
                        NOW)["progress"]
    assert progress["branches"]["total"] == 3 and progress["branches"]["finished"] == 1
    assert progress["percent"] == 50  # (1 + (1 + 0.5 + 0) / 3) / 3
    # a fan-out at the start: no node committed yet, its running branches are the ones
    at_start = diagnose(Rec("RUNNING", current_node=None, next_step=0, steps_total=3), beats,
                        NOW)["progress"]
    assert at_start["branches"]["total"] == 3 and at_start["percent"] == 16


class Beats:
    """A DiagnoseStore that records heartbeats, or refuses them (``broken``)."""

    def __init__(self, broken: bool = False) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.broken = broken

    async def record_heartbeat(self, *row: Any) -> None:
        if self.broken:
            raise ratchet.RatchetError("store unavailable", retryable=True)
        self.rows.append(row)

    async def heartbeats(self, task_id: str) -> list[dict[str, Any]]:
        return []

    async def diagnosis_rows(self, task_id: str, partition: int | None) -> dict[str, Any]:
        return {}


async def test_heartbeats_are_written_at_most_once_a_second_and_never_fail_the_step() -> None:
    clock, store = ratchet.FakeClock(), Beats()
    beat = StepHeartbeat(store, clock, "t_1", "", "n1")
    await beat.beat("crunch", 1, 0.1, "first")
    await beat.beat("crunch", 1, 0.2, "too soon")  # within the second: dropped
    clock.advance(1.0)
    await beat.beat("crunch", 1, (3, 10), "x" * 900)
    assert [(r[4], r[5]) for r in store.rows] == [(0.1, "first"), (0.3, "x" * 500)]
    with pytest.raises(InvalidMessage):
        await beat.beat("crunch", 1, 2.0)  # refused even when it would not be written
    broken = StepHeartbeat(Beats(broken=True), clock, "t_1", "", "n1")
    await broken.beat("crunch", 1, 0.5)  # logged, not raised


def test_a_report_renders_for_people_with_its_verdict() -> None:
    report = diagnose(Rec("WAITING_EXTERNAL"), rows(actions=[action("k", "IN_FLIGHT",
                                                                    accepted=True)]), NOW)
    console = Console(record=True, width=120)
    console.print(render_answer(report, NOW))
    text = console.export_text()
    assert "waiting for provider confirmation of k" in text and "unsettled_actions" in text


def test_ages_read_as_people_say_them() -> None:
    assert [age(s) for s in (5, 600, 3 * 3600, 3 * 86400, None)] == [
        "5 s", "10 min", "3 h", "3 d", "?"]


# -- over NATS, with a real node -------------------------------------------------------------

GATES: dict[str, asyncio.Event] = {}
BEATEN: dict[str, asyncio.Event] = {}
slow = ratchet.Workflow("slow", version=1)


@slow.step
async def prepare(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"pages": 10}


@slow.step
async def crunch(ctx: ratchet.StepContext) -> dict[str, Any]:
    await ctx.heartbeat(progress=(4, ctx.state["pages"]), note="page 4 of 10")
    BEATEN[ctx.task_id].set()
    await GATES[ctx.task_id].wait()
    return {}


@slow.step
async def finish(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"ok": True}}


def _beating_branch(name: str) -> ratchet.Workflow:
    wf = ratchet.Workflow(f"beating-{name}")

    @wf.step
    async def work(ctx: ratchet.StepContext) -> dict[str, Any]:
        await ctx.heartbeat(progress=0.5 if ctx.branch != "c" else 0.2, note=ctx.branch)
        BEATS[ctx.task_id].append(ctx.branch or "")
        if len(BEATS[ctx.task_id]) == 3:
            BEATEN[ctx.task_id].set()
        await GATES[ctx.task_id].wait()
        return {"output": ctx.branch}

    return wf


BEATS: dict[str, list[str]] = {}
fanned = ratchet.Workflow("fanned")


@fanned.step
async def begin(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {}


fanned.fanout("spread", {b: _beating_branch(b) for b in "abc"}, join="gather")
fanned.join("gather", of="spread", policy=ratchet.JoinPolicy("all"), next="close")


@fanned.step
async def close(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {}

registry = ratchet.Registry([slow, approve, fanned])


async def test_diagnose_shows_a_running_steps_heartbeat_without_a_checkpoint(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(registry)
    task_id = task_id_for("acme", "slow-1")
    GATES[task_id], BEATEN[task_id] = asyncio.Event(), asyncio.Event()
    await client.submit("slow", {}, key="slow-1")
    await asyncio.wait_for(BEATEN[task_id].wait(), 20)
    before = await admin(client, "get", command_id="g1", task_id=task_id)
    assert before.result is not None
    got = await admin(client, "diagnose", command_id="d1", task_id=task_id)
    assert got.ok and got.result is not None, got.error
    report = got.result
    assert report["status"] == "RUNNING" and report["current_node"] == "crunch"
    assert report["live"] and report["lease"]["owner"] == report["answered_by"]
    beat = report["progress"]["heartbeat"]
    assert beat["fraction"] == 0.4 and beat["note"] == "page 4 of 10" and beat["step"] == "crunch"
    assert report["progress"]["percent"] == 46  # (1 step + 0.4) of 3
    assert report["verdict"].startswith("running crunch (attempt 1)")
    assert "46 % — page 4 of 10" in report["verdict"]
    # admin get shows it too; the heartbeat committed no step boundary, moved no version
    assert before.result["percent"] == 46 and before.result["heartbeats"][0]["note"]
    again = await admin(client, "get", command_id="g2", task_id=task_id)
    assert again.result is not None and again.result["version"] == before.result["version"]
    GATES[task_id].set()
    await wait_terminal(client, task_id)
    done = await admin(client, "diagnose", command_id="d2", task_id=task_id)
    assert done.result is not None and done.result["verdict"].startswith("finished SUCCEEDED")
    assert done.result["progress"]["percent"] == 100


async def test_fan_out_branches_heartbeats_are_counted_in_the_tasks_percent(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(registry)
    task_id = task_id_for("acme", "fan-1")
    GATES[task_id], BEATEN[task_id], BEATS[task_id] = asyncio.Event(), asyncio.Event(), []
    await client.submit("fanned", {}, key="fan-1")
    await asyncio.wait_for(BEATEN[task_id].wait(), 20)
    got = await admin(client, "diagnose", command_id="f1", task_id=task_id)
    assert got.result is not None, got.error
    progress = got.result["progress"]
    assert progress["branches"]["total"] == 3 and progress["branches"]["finished"] == 0
    assert sorted(b["scope"] for b in progress["branches"]["beating"]) == ["a", "b", "c"]
    assert got.result["current_node"] == "spread" and progress["steps_completed"] == 1
    assert progress["steps_total"] == 2  # step nodes: begin, close
    assert progress["percent"] == int(100 * (1 + (0.5 + 0.5 + 0.2) / 3) / 2) == 70
    GATES[task_id].set()
    await wait_terminal(client, task_id)


async def test_diagnose_names_the_pending_approval_and_is_the_tenants_only(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(registry)
    task_id = (await client.submit("approve", {"amount": 90}, key="apr-d")).task_id
    async with asyncio.timeout(20):
        async for event in client.watch(task_id):
            if event.type == "approval.requested":
                break
    got = await admin(client, "diagnose", command_id="d3", task_id=task_id)
    assert got.result is not None, got.error
    [pending] = got.result["approvals"]
    assert got.result["status"] == "WAITING_APPROVAL"
    assert got.result["verdict"].startswith(f"waiting for approval {pending['approval_id']} at"
                                            " manager for ")
    assert got.result["verdict"].endswith("; expires in 60 min; approval_timeout timer fires in"
                                          " 60 min")
    other = await admin(client, "diagnose", command_id="d4", task_id=task_id, tenant="other")
    assert other.error is not None and other.error.code == "NOT_FOUND"


async def test_a_task_waiting_for_a_providers_confirmation_is_diagnosed_as_such(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(shipping_app)
    task_id = (await client.submit("shipping", {"order": 7}, key="ship-d")).task_id
    async with asyncio.timeout(20):
        async for event in client.watch(task_id):
            if event.type == "task.waiting_external":
                break
    got = await admin(client, "diagnose", command_id="s1", task_id=task_id)
    assert got.result is not None, got.error
    [action] = got.result["unsettled_actions"]
    assert action["key"] == "ship:7" and action["accepted"] and action["status"] == "IN_FLIGHT"
    [wait] = got.result["waits"]
    assert wait["correlation_id"] == "ship-7"
    assert got.result["status"] == "WAITING_EXTERNAL"
    assert got.result["verdict"].startswith("waiting for provider confirmation of ship:7 for ")
    assert any(t["kind"] for t in got.result["timers"])  # the wait's 600 s timeout
    assert "timer fires in 10 min" in got.result["verdict"]
