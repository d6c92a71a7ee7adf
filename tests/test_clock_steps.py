"""Steps of the wall clock (an NTP step, ``date -s``): detected against the steady clock,
and a forward one held, so that it neither fails a task's deadline nor fires durable timers
(approval escalation, external-wait timeout) early. On a fake clock whose wall time steps
while its monotonic time does not (``FakeClock.step``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ratchet
from ratchet import END
from ratchet.actors.transport.subscribed import subscriptions_registered
from ratchet.protocol.clock_guard import ClockGuard, ClockStep, steady_domain
from ratchet.protocol.codec import encode
from ratchet.protocol.events import decode_event
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import external_subject
from ratchet.supervisors.services.timers import TimerService
from tests.conftest import NodeFactory, NodeProcess
from tests.graph_apps import app
from tests.test_admin import admin
from tests.test_graph_flows import DONE, PARKED, run_until, submit

SYSTEM_OPERATOR = {"name": "olga", "roles": ["operator"]}


def _wait_for_shipping(name: str, timeout: float) -> ratchet.Workflow:
    wf = ratchet.Workflow(name)

    async def order(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"order": ctx.input["order"]}

    wf.add_step("order", order)
    wf.wait("shipped", correlation=lambda s: f"order-{s['order']}", timeout=timeout,
            on_timeout="fail", next=END)
    return wf


#: A wait whose timer is due in 30 minutes, and one due in 4 seconds.
restart_app = ratchet.Registry([_wait_for_shipping("wait30", 1800.0),
                                _wait_for_shipping("wait4", 4.0)])


def test_a_forward_step_is_held_until_the_clock_has_been_steady_for_the_hold() -> None:
    clock = ratchet.FakeClock(start=1000.0)
    seen: list[ClockStep] = []
    guard = ClockGuard(clock, threshold=5.0, hold=600.0, on_step=seen.append)
    clock.advance(10.0)
    assert guard.due_now() == guard.now() == 1010.0  # time moving on is no step
    clock.step(3600.0)
    assert guard.now() == 4610.0  # rows and events record the wall clock
    assert guard.due_now() == 1010.0  # deadlines and timers: the time before the step
    assert [s.seconds for s in seen] == [3600.0] and guard.steps == 1
    clock.advance(599.0)
    assert guard.due_now() == 1609.0  # carried on by the steady clock
    assert guard.status()["clock_held_s"] == 3600.0
    clock.advance(1.0)
    assert guard.due_now() == guard.now() == 5210.0  # steady for the hold: believed


def test_a_step_back_undoes_a_held_one_and_a_backward_step_is_never_held() -> None:
    clock = ratchet.FakeClock(start=1000.0)
    guard = ClockGuard(clock, threshold=5.0, hold=600.0)
    clock.step(3600.0)
    guard.now()
    clock.step(-3600.0)  # the NTP server was fixed
    assert guard.due_now() == guard.now() == 1000.0 and guard.steps == 2
    clock.step(-60.0)
    assert guard.due_now() == guard.now() == 940.0  # timers fire late, never early
    clock.step(4.0)  # within the threshold: no step
    assert guard.steps == 3


def test_an_operator_acknowledges_the_new_time() -> None:
    clock = ratchet.FakeClock(start=1000.0)
    guard = ClockGuard(clock, threshold=5.0, hold=600.0)
    clock.step(3600.0)
    assert guard.due_now() == 1000.0
    assert guard.acknowledge() == 3600.0
    assert guard.due_now() == guard.now() == 4600.0


async def _parked_tasks(client: ratchet.Client) -> dict[str, str]:
    """An approval (3,600 s timeout), an external wait (600 s), and an external wait of a
    task with a 1,800 s deadline, all parked."""
    approval, _ = await submit(client, "approve", {"amount": 900}, "apr", PARKED)
    waiting, _ = await submit(client, "wait", {"order": 1}, "wait", {"wait.started"})
    deadline = (await client.submit("wait", {"order": 2}, key="deadline", deadline_s=1800.0)).task_id
    await run_until(client, deadline, {"wait.started"})
    return {"approval": approval, "wait": waiting, "deadline": deadline}


def _timers(node: ratchet.Node) -> TimerService:
    ref = node.system.lookup("node/timers")
    assert ref is not None
    service: Any = ref._actor
    assert isinstance(service, TimerService)
    return service


async def _statuses(client: ratchet.Client, tasks: dict[str, str]) -> dict[str, str]:
    return {name: (await client.get(task_id)).status for name, task_id in tasks.items()}


async def _ship(client: ratchet.Client, order: int) -> None:
    env = Envelope(type="external.resolved", message_id=f"ship-{order}",
                           correlation_id=f"ship-{order}",
                           body={"correlation_id": f"order-{order}", "outcome": "completed",
                                 "result": {"tracking": f"TRK-{order}"}})
    await client.publish_signed(external_subject("acme"), encode(env))


async def test_a_forward_step_of_an_hour_fails_no_deadline_and_fires_no_timer_early(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(app, clock=clock, clock_step_hold=600.0)
    tasks = await _parked_tasks(client)
    clock.step(3600.0)  # a bad NTP step
    clock.advance(1.0)  # the timer service wakes, and finds nothing due
    assert await _timers(node).fire_due() == 0
    assert node.clock.steps == 1  # detected (and logged, and in the heartbeat)
    # The deadline task's confirmation arrives: its deadline did not pass, it goes on.
    await _ship(client, 2)
    events = await run_until(client, tasks["deadline"], DONE)
    assert events[-1].type == "task.succeeded", events[-1].payload
    assert await _statuses(client, {k: tasks[k] for k in ("approval", "wait")}) == {
        "approval": "WAITING_APPROVAL", "wait": "WAITING_EXTERNAL"}
    # Steady for the hold: the new time is believed and the timers now really due fire.
    clock.advance(600.0)
    events = await run_until(client, tasks["wait"], DONE)
    assert events[-1].payload["reason"] == "external wait timed out"
    events = await run_until(client, tasks["approval"], {"approval.timed_out"}, after=4)
    assert events[-1].payload["escalated_to"] == "director"


async def test_clock_ack_releases_the_held_timers_at_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(app, clock=clock, clock_step_hold=600.0)
    tasks = await _parked_tasks(client)
    clock.step(3600.0)
    clock.advance(1.0)
    assert await _timers(node).fire_due() == 0
    reply = await admin(client, "clock-ack", command_id="ack-1", tenant="_system",
                        principal=SYSTEM_OPERATOR, args={"node": node.config.node_id})
    assert reply.ok and reply.result is not None, reply
    assert reply.result["released_s"] == 3600.0
    clock.advance(1.0)
    events = await run_until(client, tasks["wait"], DONE)
    assert events[-1].payload["reason"] == "external wait timed out"
    events = await run_until(client, tasks["approval"], {"approval.timed_out"}, after=4)
    assert events[-1].payload["escalated_to"] == "director"
    # Nothing held any more: an acknowledgement again releases nothing.
    again = await admin(client, "clock-ack", command_id="ack-2", tenant="_system",
                        principal=SYSTEM_OPERATOR, args={"node": node.config.node_id})
    assert again.result is not None and again.result["released_s"] == 0.0


async def test_a_step_is_published_as_a_node_event(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(app, clock=clock, clock_step_hold=600.0)
    sub = await client.nc.subscribe("ratchet.events._system.>")
    await subscriptions_registered(client.nc)  # before the node publishes
    clock.step(3600.0)
    node.clock.now()  # whatever reads the clock first notices the step
    msg = await sub.next_msg(timeout=10)
    event = decode_event(msg.data)
    assert msg.subject == f"ratchet.events._system.{node.config.node_id}.node.clock_stepped"
    assert event.type == "node.clock_stepped" and event.task_id == node.config.node_id
    assert event.payload["seconds"] == 3600.0 and event.payload["held_s"] == 3600.0
    assert event.sequence == 1 and event.tenant == "_system"


def _reading(clock: ratchet.FakeClock, held: float = 0.0, **over: Any) -> dict[str, Any]:
    return {"clock_wall": clock.now() - held, "clock_steady": clock.monotonic(),
            "clock_domain": "FakeClock", "clock_held_s": held, **over}


def test_a_start_an_hour_ahead_of_the_stores_reading_is_a_held_step() -> None:
    clock = ratchet.FakeClock(start=1000.0)
    reading = _reading(clock)  # what the node's last heartbeat recorded
    clock.advance(120.0)  # down for two minutes
    clock.step(3600.0)  # and back with its clock an hour ahead
    seen: list[ClockStep] = []
    guard = ClockGuard(clock, threshold=5.0, hold=600.0, on_step=seen.append)
    step = guard.judge_start([reading, {"pid": 1}])  # rows of older versions: ignored
    assert step is not None and step.reference == "store" and step.seconds == 3600.0
    assert seen == [step] and guard.steps == 1
    assert guard.due_now() == 1120.0 and guard.now() == 4720.0
    assert guard.status()["clock_wall"] == 1120.0  # what its heartbeat records: believed


def test_a_start_on_time_or_within_what_slewing_explains_is_no_step() -> None:
    clock = ratchet.FakeClock(start=1000.0)
    reading = _reading(clock)
    clock.advance(86_400.0)
    clock.step(40.0)  # a day later, 40 s off: NTP may slew 43 s a day
    assert ClockGuard(clock, threshold=5.0).judge_start([reading]) is None
    clock.step(10.0)
    assert ClockGuard(clock, threshold=5.0).judge_start([reading]) is not None


def test_a_start_judges_by_the_freshest_reading_and_what_it_held() -> None:
    clock = ratchet.FakeClock(start=1000.0)
    clock.step(3600.0)  # a node held this step; its heartbeat says so
    held = _reading(clock, held=3600.0)
    clock.advance(30.0)
    stale = _reading(ratchet.FakeClock(start=0.0))  # an older reading, long ago
    guard = ClockGuard(clock, threshold=5.0, hold=600.0)
    step = guard.judge_start([stale, held])  # restarted with the clock still ahead
    assert step is not None and step.seconds == 3600.0 and guard.held == 3600.0


def test_without_a_reading_of_its_steady_clock_only_a_clock_behind_is_seen() -> None:
    clock = ratchet.FakeClock(start=10_000.0)
    other_boot = {"clock_wall": 13_600.0, "clock_steady": 5.0, "clock_domain": "boot:old"}
    guard = ClockGuard(clock, threshold=5.0, hold=600.0)
    step = guard.judge_start([other_boot])
    assert step is not None and step.seconds == -3600.0 and guard.held == 0.0
    ahead = ClockGuard(clock, threshold=5.0).judge_start(
        [{**other_boot, "clock_wall": 6_400.0}])
    assert ahead is None  # an hour after every recorded time: downtime, or an hour ahead


def test_the_system_clocks_readings_compare_across_processes_of_one_boot() -> None:
    system = ratchet.SystemClock()
    domain = steady_domain(system)
    if not domain.startswith("boot:"):
        pytest.skip("no CLOCK_BOOTTIME and boot id here")
    first = ClockGuard(system).status()
    assert first["clock_domain"] == domain
    assert ClockGuard(system).judge_start([first]) is None
    guard = ClockGuard(system, threshold=5.0, hold=600.0)
    step = guard.judge_start([{**first, "clock_wall": first["clock_wall"] - 3600.0}])
    assert step is not None and 3590.0 < step.seconds < 3610.0 and guard.held == step.held


async def test_a_node_restarted_with_its_clock_an_hour_ahead_holds_a_30_minute_timer(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(restart_app, clock=clock, clock_step_hold=600.0)
    task_id, _ = await submit(client, "wait30", {"order": 30}, "w30", {"wait.started"})
    await node.stop()  # its heartbeats left a reading of its clock in the store
    clock.step(3600.0)  # it comes back an hour ahead: no step while it runs
    sub = await client.nc.subscribe("ratchet.events._system.>")
    await subscriptions_registered(client.nc)
    again = await start_node(restart_app, clock=clock, clock_step_hold=600.0)
    event = decode_event((await sub.next_msg(timeout=10)).data)
    assert event.type == "node.clock_stepped", event
    assert event.payload["seconds"] == 3600.0 and event.payload["held_s"] == 3600.0
    assert event.payload["reference"] == "store" and again.clock.steps == 1
    clock.advance(1.0)
    assert await _timers(again).fire_due() == 0  # 30 minutes have not passed
    assert (await client.get(task_id)).status == "WAITING_EXTERNAL"
    reply = await admin(client, "clock-ack", command_id="ack-start", tenant="_system",
                        principal=SYSTEM_OPERATOR, args={"node": again.config.node_id})
    assert reply.result is not None and reply.result["released_s"] == 3600.0, reply
    clock.advance(1.0)  # the timer service wakes: now the timer is really due
    events = await run_until(client, task_id, DONE)
    assert events[-1].payload["reason"] == "external wait timed out"


def _libfaketime() -> str | None:
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    return str(found[0]) if found else None


@pytest.mark.slow
@pytest.mark.skipif(_libfaketime() is None,
                    reason="libfaketime is not installed (Debian: apt-get install libfaketime;"
                           " .ci/run installs it)")
async def test_a_node_process_restarted_an_hour_ahead_under_libfaketime_holds_its_timers(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess]
) -> None:
    """The real clocks: ``ratchet serve`` SIGKILLed with two waits armed (4 s and 30 min),
    started again under libfaketime an hour ahead (its wall clock only, as an NTP step).
    The 4 s timer firing shows the timer service judged the timers; the 30-minute one
    must not fire with it, until ``clock-ack``."""
    args = ("--node-id", "n1", "--clock-step-hold", "600")
    app_spec = "tests.test_clock_steps:restart_app"
    first = node_process(nats_url, app_spec=app_spec, args=args)
    await asyncio.to_thread(first.start)
    long_task, _ = await submit(client, "wait30", {"order": 30}, "w30", {"wait.started"})
    short_task, _ = await submit(client, "wait4", {"order": 4}, "w4", {"wait.started"})
    await asyncio.to_thread(first.kill)
    sub = await client.nc.subscribe("ratchet.events._system.>")
    await subscriptions_registered(client.nc)
    ahead = {"LD_PRELOAD": _libfaketime() or "", "FAKETIME": "+1h",
             "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    again = node_process(nats_url, ahead, app_spec=app_spec, args=args)
    await asyncio.to_thread(again.start)
    event = decode_event((await sub.next_msg(timeout=10)).data)
    assert event.type == "node.clock_stepped" and event.payload["reference"] == "store"
    assert 3590.0 < event.payload["seconds"] < 3610.0, event.payload
    events = await run_until(client, short_task, DONE)
    assert events[-1].payload["reason"] == "external wait timed out"
    assert (await client.get(long_task)).status == "WAITING_EXTERNAL"
    reply = await admin(client, "clock-ack", command_id="ack-lft", tenant="_system",
                        principal=SYSTEM_OPERATOR, args={"node": "n1"})
    assert reply.result is not None and reply.result["released_s"] > 3590.0, reply
    events = await run_until(client, long_task, DONE)
    assert events[-1].payload["reason"] == "external wait timed out"
    assert again.interrupt() == 0
