"""Schedules: the tick arithmetic and missed-ticks policies (pure), and a node firing one
task per tick on the fake clock — across a restart that repeats a tick, with missed ticks
after downtime, paused and deleted schedules, bad cron expressions refused with a typed
error — and the ``ratchet schedule`` command as a user runs it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from pydantic import BaseModel

import ratchet
from ratchet.protocol.errors import InvalidSchedule
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.schedules import (
    MISSED_GRACE,
    ScheduleSpec,
    parse_spec,
    plan_ticks,
    tick_after,
    tick_key,
)
from ratchet.supervisors.services.intake import Acceptor
from ratchet.supervisors.services.schedules import ScheduleService
from tests.apps import three
from tests.conftest import RATCHET_BIN, ROOT, NodeFactory, node_key, wait_terminal

T0 = 1_800_000_000.0  # the FakeClock's start: a whole second


# -- the arithmetic ---------------------------------------------------------------------------

def test_an_interval_ticks_every_n_seconds_from_its_anchor() -> None:
    spec = parse_spec({"every": 60}, T0 + 0.4)
    assert spec.anchor == T0
    assert tick_after(spec, T0) == T0 + 60 and tick_after(spec, T0 + 60) == T0 + 120
    assert plan_ticks(spec, T0 + 60, T0 + 60).fire == [T0 + 60]


def test_a_cron_expression_is_read_in_its_time_zone_summer_and_winter() -> None:
    paris = ZoneInfo("Europe/Paris")
    spec = parse_spec({"cron": "0 9 * * *", "timezone": "Europe/Paris"}, T0)
    for month in (1, 7):  # 08:00 UTC in winter, 07:00 UTC in summer
        start = datetime(2027, month, 10, 12, 0, tzinfo=paris).timestamp()
        tick = datetime.fromtimestamp(tick_after(spec, start), paris)
        assert (tick.day, tick.hour, tick.minute) == (11, 9, 0)


@pytest.mark.parametrize(("missed", "fired"), [
    ("skip", []), ("latest", [10]), ("catch_up", [8, 9, 10])])
def test_missed_ticks_follow_the_policy(missed: str, fired: list[int]) -> None:
    spec = ScheduleSpec(every=300.0, missed=missed, catch_up=3, anchor=T0)
    now = T0 + 10 * 300 + MISSED_GRACE + 90  # ticks 1..10 all missed
    plan = plan_ticks(spec, T0 + 300, now)
    assert plan.fire == [T0 + k * 300 for k in fired]
    assert plan.skipped == 10 - len(fired)
    assert plan.next_at == T0 + 11 * 300


def test_an_on_time_tick_fires_under_every_policy() -> None:
    for missed in ("skip", "latest", "catch_up"):
        spec = ScheduleSpec(every=300.0, missed=missed, catch_up=3, anchor=T0)
        plan = plan_ticks(spec, T0 + 300, T0 + 3 * 300 + 5)  # ticks 1, 2 missed; 3 on time
        expected = {"skip": [3], "latest": [3], "catch_up": [1, 2, 3]}[missed]
        assert plan.fire == [T0 + k * 300 for k in expected], missed


@pytest.mark.parametrize("args", [
    {"cron": "61 * * * *"}, {"cron": "not a cron"}, {"cron": "0 0 30 2 *"},
    {"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, {"every": 0}, {"every": 1.5},
    {"every": 60, "cron": "* * * * *"}, {}, {"every": 60, "missed": "sometimes"},
    {"every": 60, "missed": "catch_up", "catch_up": 0}])
def test_a_bad_schedule_is_refused_naming_the_field(args: dict[str, Any]) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        parse_spec(args, T0)
    assert caught.value.code.value == "INVALID_ARGUMENT" and caught.value.details["field"]


def test_a_tick_key_is_the_schedule_and_the_utc_time() -> None:
    assert tick_key("nightly", T0) == "nightly:2027-01-15T08:00:00Z"


# -- a node firing them -----------------------------------------------------------------------

async def _create(client: ratchet.Client, name: str, **args: Any) -> dict[str, Any]:
    return await client.request_admin("schedule-create", {
        "command_id": new_id("cmd"), "args": {"name": name, "workflow": "three", **args}})


async def _verb(client: ratchet.Client, verb: str, name: str | None = None) -> dict[str, Any]:
    return await client.request_admin(verb, {"command_id": new_id("cmd"),
                                             "args": {"name": name} if name else {}})


def _tick_task(name: str, tick: float) -> str:
    return task_id_for("acme", tick_key(name, tick))


async def _moved_past(client: ratchet.Client, name: str, when: float,
                      nudge: ratchet.FakeClock | None = None) -> dict[str, Any]:
    """Wait (bounded) until the schedule's next tick is after ``when``: its pass is done.

    ``nudge``: after a restart, a node's first pass comes before it holds its partitions;
    it looks again on its clock, which a test moves (by a few ms of fake time per look)."""
    for _ in range(1000):
        rows = {r["name"]: r for r in (await _verb(client, "schedule-list"))["schedules"]}
        if rows[name]["next_at"] > when:
            return rows[name]
        if nudge is not None:
            nudge.advance(0.02)
        await asyncio.sleep(0.01)
    raise AssertionError(f"schedule {name} never moved past {when}")


def _sql(node: ratchet.Node, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the node's store as it is (behind its back): its SQLite file, or its
    PostgreSQL database under RATCHET_TEST_STORE=postgres."""
    if node.config.store:
        with psycopg.connect(node.config.store, autocommit=True) as pg:
            cur = pg.execute(sql.replace("?", "%s"), args)
            return cur.fetchall() if cur.description else []
    with sqlite3.connect(node.config.db_path) as db:
        return db.execute(sql, args).fetchall()


def _scheduled_tasks(node: ratchet.Node, name: str) -> list[str]:
    rows = _sql(node, "SELECT idempotency_key FROM requests WHERE idempotency_key LIKE ?"
                " ORDER BY idempotency_key", (f"{name}:%",))
    return [r[0] for r in rows]


async def test_each_tick_submits_one_task_keyed_by_the_schedule_and_the_tick(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(clock=clock)
    created = await _create(client, "poll", every=60, input={"n": 1})
    assert created["schedule"]["next_at"] == T0 + 60
    for k in (1, 2):
        clock.advance(60.0)
        row = await _moved_past(client, "poll", T0 + k * 60)
        assert row["last_task_id"] == _tick_task("poll", T0 + k * 60)
        events = await wait_terminal(client, row["last_task_id"])
        assert events[-1].type == "task.succeeded"
    assert _scheduled_tasks(node, "poll") == [tick_key("poll", T0 + 60),
                                              tick_key("poll", T0 + 120)]


async def test_a_tick_fired_again_after_a_restart_finds_its_task_and_makes_no_second(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(clock=clock)
    await _create(client, "once", every=60)
    clock.advance(60.0)
    await _moved_past(client, "once", T0 + 60)
    await node.stop()
    # As if the node had died after submitting the tick and before moving the schedule on.
    _sql(node, "UPDATE schedules SET next_at = ? WHERE name = 'once'", (T0 + 60,))
    node = await start_node(clock=clock)
    row = await _moved_past(client, "once", T0 + 60, nudge=clock)
    assert row["last_task_id"] == _tick_task("once", T0 + 60)
    assert _scheduled_tasks(node, "once") == [tick_key("once", T0 + 60)]  # still one task


async def test_passes_racing_over_the_same_tick_make_one_task(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    """What two nodes that both believe they hold the partition do: both submit the tick
    under its key, one task exists, one of them moves the schedule on."""
    clock = ratchet.FakeClock()
    node = await start_node(clock=clock)
    await _create(client, "race", every=60)
    assert node.store is not None and node.tasks is not None
    acceptor = Acceptor(node.store, node.registry, clock, "other", node.config.partitions)
    others = [ScheduleService(node.store, node.tasks, acceptor, clock) for _ in range(3)]
    clock.advance(60.0)
    moved = await asyncio.gather(*(other.fire_due() for other in others))
    row = await _moved_past(client, "race", T0 + 60)
    assert sum(moved) <= 1 and row["last_task_id"] == _tick_task("race", T0 + 60)
    assert _scheduled_tasks(node, "race") == [tick_key("race", T0 + 60)]


async def test_ticks_missed_while_no_node_ran_follow_each_schedules_policy(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(clock=clock)
    await _create(client, "s-skip", every=300, missed="skip")
    await _create(client, "s-latest", every=300, missed="latest")
    await _create(client, "s-catch", every=300, missed="catch_up", catch_up=3)
    await node.stop()
    clock.advance(10 * 300 + 150)  # ten ticks fall while the node is down, none on time
    node = await start_node(clock=clock)
    down_until = clock.now()
    for name in ("s-skip", "s-latest", "s-catch"):
        await _moved_past(client, name, down_until, nudge=clock)
    assert _scheduled_tasks(node, "s-skip") == []
    assert _scheduled_tasks(node, "s-latest") == [tick_key("s-latest", T0 + 3000)]
    assert _scheduled_tasks(node, "s-catch") == [tick_key("s-catch", T0 + k * 300)
                                                 for k in (8, 9, 10)]


async def test_a_paused_schedule_fires_nothing_and_resumes_at_its_next_tick_and_a_deleted_one_is_gone(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(clock=clock)
    await _create(client, "control", every=60)
    await _create(client, "paused", every=60)
    await _create(client, "deleted", every=60)
    await _verb(client, "schedule-pause", "paused")
    assert (await _verb(client, "schedule-delete", "deleted")) == {"deleted": "deleted"}
    clock.advance(120.0)
    await _moved_past(client, "control", T0 + 120)  # the pass that would have fired them
    assert _scheduled_tasks(node, "paused") == [] and _scheduled_tasks(node, "deleted") == []
    listed = {r["name"]: r for r in (await _verb(client, "schedule-list"))["schedules"]}
    assert set(listed) == {"control", "paused"} and listed["paused"]["paused"] is True
    resumed = await _verb(client, "schedule-resume", "paused")
    assert resumed["next_at"] == T0 + 180  # the ticks that fell while paused are not run
    clock.advance(60.0)
    await _moved_past(client, "paused", T0 + 180)
    assert _scheduled_tasks(node, "paused") == [tick_key("paused", T0 + 180)]
    with pytest.raises(ratchet.RemoteError) as missing:
        await _verb(client, "schedule-delete", "deleted")
    assert missing.value.code.value == "NOT_FOUND"


@pytest.mark.parametrize(("args", "code"), [
    ({"every": 60, "workflow": "no.such.flow"}, "INVALID_ARGUMENT"),
    ({"cron": "0 25 * * *"}, "INVALID_ARGUMENT"),
    ({"cron": "0 9 * * *", "timezone": "Nowhere/City"}, "INVALID_ARGUMENT"),
])
async def test_a_schedule_that_cannot_be_is_refused_with_a_typed_error(
    start_node: NodeFactory, client: ratchet.Client, args: dict[str, Any], code: str
) -> None:
    await start_node()
    with pytest.raises(ratchet.RemoteError) as refused:
        await _create(client, "bad", **args)
    assert refused.value.wire_code == code
    assert (await _verb(client, "schedule-list"))["schedules"] == []


class KeyedInput(BaseModel):
    customer: str
    api_key: ratchet.SecretStr


def _keyed() -> ratchet.Workflow:
    wf = ratchet.Workflow("keyed", input_model=KeyedInput)

    @wf.step
    async def use(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"tail": ctx.input["api_key"].get_secret_value()[-3:]}}

    return wf


async def test_a_schedules_secret_input_is_sealed_in_its_row_and_clear_to_its_tasks(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(ratchet.Registry([_keyed(), three]), clock=clock)
    created = await _create(client, "keyed-poll", workflow="keyed", every=60,
                            input={"customer": "c-1", "api_key": "sk_live_4242"})
    assert created["schedule"]["input"]["api_key"] == ratchet.REDACTED
    [(blob,)] = _sql(node, "SELECT input FROM schedules")
    assert b"sk_live_4242" not in bytes(blob)
    with pytest.raises(ratchet.RemoteError) as invalid:
        await _create(client, "keyed-bad", workflow="keyed", every=60, input={"customer": 1})
    assert invalid.value.wire_code == "INVALID_ARGUMENT"
    clock.advance(60.0)
    row = await _moved_past(client, "keyed-poll", T0 + 60)
    assert row["last_error"] is None, row
    events = await wait_terminal(client, row["last_task_id"])
    assert events[-1].payload["output"] == {"tail": "242"}


async def test_a_schedule_name_is_taken_once_per_tenant(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    await _create(client, "twice", every=60)
    with pytest.raises(ratchet.RemoteError) as taken:
        await _create(client, "twice", every=120)
    assert taken.value.wire_code == "CONFLICT"


async def _cli(tmp_path: Path, url: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(RATCHET_BIN), "--state-dir", str(tmp_path / "cli"), "--log-level", "warning",
        "schedule", *args, "--nats-url", url, "--tenant", "acme", "--creds",
        str(node_key(tmp_path)), cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_schedule_command_creates_lists_pauses_and_deletes(
    start_node: NodeFactory, nats_url: str, tmp_path: Path
) -> None:
    await start_node()
    code, out, err = await _cli(tmp_path, nats_url, "create", "nightly", "three", "--cron",
                                "0 2 * * *", "--timezone", "Europe/Paris", "--input",
                                '{"n": 1}', "--missed", "latest")
    assert code == 0, err
    assert json.loads(out)["schedule"]["timezone"] == "Europe/Paris"
    code, out, _ = await _cli(tmp_path, nats_url, "pause", "nightly")
    assert code == 0 and json.loads(out)["paused"] is True
    code, out, _ = await _cli(tmp_path, nats_url, "list")
    [row] = json.loads(out)["schedules"]
    assert (row["name"], row["cron"], row["missed"], row["paused"]) == (
        "nightly", "0 2 * * *", "latest", True)
    code, out, _ = await _cli(tmp_path, nats_url, "delete", "nightly")
    assert code == 0 and json.loads(out) == {"deleted": "nightly"}
    code, _, err = await _cli(tmp_path, nats_url, "create", "bad", "three", "--every", "60",
                              "--input", "{not json")
    assert code == 2 and "--input" in err
