"""Counts kept as a node commits: the figures the store does not keep in a form a scrape can
read cheaply (step latency, retries by error class, budget exhaustions, crash-loop stops).

Fed by the store's outbox listener (called on the loop with the outbox rows of every
commit; persistence/store.py), so no hot path of the task actor changes: per commit it is
one prefix test per row, and a msgpack decode only for the three event types whose payload
it reads (``step.completed``, ``step.failed``, ``action.retry``: the catalogue's). Plain dictionaries and a
bisect, no locks: everything runs on the node's event loop (bench/observe.py measures the
cost). Counts are of this process since it started, as Prometheus counters are.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
import structlog

from ratchet.persistence.txn_events import OutboxRow
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.states import TaskStatus

__all__ = ["STEP_BUCKETS", "EventFigures", "Histogram"]

log = structlog.get_logger("ratchet.metrics")

#: Upper bounds (seconds) of the step latency histogram's buckets.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0)
_PREFIX = "ratchet.events."
#: Terminal task events: ``ratchet_tasks_finished_total``'s status label.
_FINISHED: dict[str, str] = {
    EventType.TASK_SUCCEEDED: TaskStatus.SUCCEEDED, EventType.TASK_FAILED: TaskStatus.FAILED,
    EventType.TASK_CANCELLED: TaskStatus.CANCELLED}
#: Event type → the counter it bumps (no payload needed), labelled by tenant.
_COUNTED: dict[str, str] = {
    EventType.AGENT_BUDGET_EXHAUSTED: "budget_exhausted",
    EventType.TASK_RECOVERY_STOPPED: "crash_loop_stops",
    EventType.ACTION_UNKNOWN: "actions_unknown",
    EventType.TASK_HANDOFF: "handoffs", EventType.TASK_UNKNOWN: "handoffs"}


@dataclass
class Histogram:
    """Cumulative-ready bucket counts (the last bucket: above every bound) and their sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


class EventFigures:
    """The outbox listener and what it has counted (read by metrics.py at each scrape)."""

    def __init__(self) -> None:
        #: tenant → step durations
        self.step_seconds: dict[str, Histogram] = {}
        #: (tenant, kind "step" | "action", error class) → count
        self.retries: Counter[tuple[str, str, str]] = Counter()
        #: (counter name, tenant) → count; names from _COUNTED
        self.counted: Counter[tuple[str, str]] = Counter()
        #: (tenant, terminal status) → count
        self.finished: Counter[tuple[str, str]] = Counter()
        self.unreadable = 0

    def __call__(self, rows: list[OutboxRow]) -> None:
        """The outbox listener: runs on the loop after each commit that queued rows; never
        raises (a row it cannot read is counted in ``unreadable`` and skipped)."""
        for row in rows:
            subject = row.subject
            if not subject.startswith(_PREFIX):
                continue
            parts = subject.split(".", 4)  # ratchet.events.<tenant>.<task_id>.<type>
            if len(parts) < 5:
                continue
            tenant, kind = parts[2], parts[4]
            try:
                self._count(tenant, kind, row)
            except Exception as exc:  # a metric must never break a commit's listeners
                self.unreadable += 1
                log.debug("event not counted", subject=subject, error=repr(exc))

    def _count(self, tenant: str, kind: str, row: OutboxRow) -> None:
        if kind == EventType.STEP_COMPLETED:
            ms = _payload(row).get("duration_ms")
            if isinstance(ms, int | float):
                hist = self.step_seconds.get(tenant)
                if hist is None:
                    hist = self.step_seconds[tenant] = Histogram(STEP_BUCKETS)
                hist.observe(ms / 1000)
        elif kind == EventType.STEP_FAILED:
            error = _payload(row).get("error") or {}
            self.retries[(tenant, "step", str(error.get("code") or error.get("type")
                                               or "unknown"))] += 1
        elif kind == EventType.ACTION_RETRY:
            self.retries[(tenant, "action", str(_payload(row).get("reason") or "unknown"))] += 1
        elif kind in _FINISHED:
            self.finished[(tenant, _FINISHED[kind])] += 1
        elif kind in _COUNTED:
            self.counted[(_COUNTED[kind], tenant)] += 1


def _payload(row: OutboxRow) -> dict[str, Any]:
    event = msgpack.unpackb(row.payload, raw=False)
    payload = event.get("payload") if isinstance(event, dict) else None
    return payload if isinstance(payload, dict) else {}
