"""Events about a node rather than a task, on the events stream of the system tenant.

``ratchet.events._system.<node_id>.<type>``, in the same wire format as a task's events
(``protocol/events.py``) with the node id in ``task_id`` and a per-node, per-process
``sequence``. Best effort: they are observations for operators (a wall-clock step), not
state; a node that cannot publish one logs it and goes on.

``node.clock_stepped``: the wall clock jumped. ``node.audit_tampered``: the audit chain did
not verify at the node's start.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import structlog

from ratchet.actors.transport.bus import Bus
from ratchet.persistence.audit_check import AuditReport
from ratchet.protocol.admin_verbs import SYSTEM_TENANT
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock
from ratchet.protocol.clock_guard import ClockStep
from ratchet.protocol.events import encode_event
from ratchet.protocol.ids import new_id
from ratchet.protocol.subjects import event_subject, is_token

__all__ = ["NodeEvents"]

log = structlog.get_logger("ratchet.node")


class NodeEvents:
    def __init__(self, node_id: str, clock: Clock) -> None:
        self.node_id = node_id
        self.clock = clock
        self._sequence = itertools.count(1)
        self._bus: Bus | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def attach(self, bus: Bus) -> None:
        """Publish from now on, on this bus and the running loop."""
        self._bus, self._loop = bus, asyncio.get_running_loop()

    def clock_stepped(self, step: ClockStep) -> None:
        """Emit ``node.clock_stepped``. Safe from any thread (the step is noticed by
        whatever read the clock first, the store's writer thread included)."""
        self._emit(EventType.NODE_CLOCK_STEPPED, {
            "node": self.node_id, "seconds": round(step.seconds, 3),
            "held_s": round(step.held, 3), "wall": step.wall, "reference": step.reference})

    def audit_tampered(self, report: AuditReport) -> None:
        """Emit ``node.audit_tampered`` with the first problems of the check."""
        self._emit(EventType.NODE_AUDIT_TAMPERED, {
            "node": self.node_id, "entries": report.entries, "head_seq": report.head_seq,
            "problems": report.problems[:20],
            "more_problems": report.more_problems + max(0, len(report.problems) - 20)})

    def _emit(self, event_type: str, payload: dict[str, Any]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or not is_token(self.node_id):
            return  # not started (or a node id no subject can carry): the log line stays
        loop.call_soon_threadsafe(self._send, event_type, payload, next(self._sequence))

    def _send(self, event_type: str, payload: dict[str, Any], sequence: int) -> None:
        task = asyncio.get_running_loop().create_task(self._publish(event_type, payload,
                                                                    sequence))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _publish(self, event_type: str, payload: dict[str, Any], sequence: int) -> None:
        if self._bus is None:
            return
        event_id = new_id("evt")
        data = encode_event(event_id=event_id, task_id=self.node_id, tenant=SYSTEM_TENANT,
                            sequence=sequence, event_type=event_type, aggregate_version=0,
                            occurred_at=self.clock.now(), producer=self.node_id,
                            payload=payload)
        try:
            await self._bus.js.publish(event_subject(SYSTEM_TENANT, self.node_id, event_type),
                                       data, headers={"Nats-Msg-Id": event_id})
        except Exception as exc:  # an observation, not state: say so and go on
            log.warning("node event not published", type=event_type, error=repr(exc))
