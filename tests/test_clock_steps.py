"""Steps of the wall clock (an NTP step, ``date -s``): detected against the steady clock,
and a forward one held, so that it neither fails a task's deadline nor fires durable timers
(approval escalation, external-wait timeout) early. On a fake clock whose wall time steps
while its monotonic time does not (``FakeClock.step``)."""

from __future__ import annotations

from typing import Any

import ratchet
from ratchet.protocol.clock_guard import ClockGuard, ClockStep
from ratchet.protocol.codec import encode
from ratchet.protocol.events import decode_event
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import external_subject
from ratchet.supervisors.services.timers import TimerService
from tests.conftest import NodeFactory
from tests.graph_apps import app
from tests.test_admin import admin
from tests.test_graph_flows import DONE, PARKED, run_until, submit

SYSTEM_OPERATOR = {"name": "olga", "roles": ["operator"]}


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
    deadline = await client.submit("wait", {"order": 2}, key="deadline", deadline_s=1800.0)
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
    await client.nc.flush()  # the server has the subscription before the node publishes
    clock.step(3600.0)
    node.clock.now()  # whatever reads the clock first notices the step
    msg = await sub.next_msg(timeout=10)
    event = decode_event(msg.data)
    assert msg.subject == f"ratchet.events._system.{node.config.node_id}.node.clock_stepped"
    assert event.type == "node.clock_stepped" and event.task_id == node.config.node_id
    assert event.payload["seconds"] == 3600.0 and event.payload["held_s"] == 3600.0
    assert event.sequence == 1 and event.tenant == "_system"
