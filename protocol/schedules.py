"""Schedules: when a schedule's ticks fall, and which of them a node fires.

A schedule submits one task of a workflow at each tick: a cron expression read in an IANA
time zone (``croniter``; ``0 9 * * mon-fri`` in ``Europe/Paris`` is 09:00 Paris time,
summer and winter), or a fixed interval (``every`` seconds, counted from a whole-second
anchor). Each tick's task has the idempotency key ``<schedule>:<tick time>`` (UTC, ISO
8601), so a tick never submits two tasks, whichever node fires it and however often.

Ticks are *missed* when they are found more than :data:`MISSED_GRACE` seconds after their
time (the node was down, or every node was); the schedule's policy decides:

==========  ==================================================================
``skip``    missed ticks are not run (the default); the next on-time one is
``latest``  the latest due tick is run once, the older missed ones are skipped
``catch_up``  the latest ``catch_up`` missed ticks run (oldest first), older ones
            are skipped
==========  ==================================================================

Policy as data and pure functions over epoch seconds: tested without I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ratchet.protocol.errors import InvalidSchedule

if TYPE_CHECKING:
    from croniter import croniter

__all__ = ["MISSED_POLICIES", "MISSED_GRACE", "MAX_CATCH_UP", "ScheduleSpec", "TickPlan",
           "SCHEDULE_NAME", "parse_spec", "plan_ticks", "spec_from_dict", "tick_after",
           "tick_key"]

MISSED_POLICIES = ("skip", "latest", "catch_up")
#: Seconds after its time a tick is still on time; later, it is missed.
MISSED_GRACE = 60.0
#: The most missed ticks ``catch_up`` may run at once.
MAX_CATCH_UP = 1000
#: On-time ticks fired in one pass at most (a seconds-field cron inside the grace).
_MAX_ON_TIME = 64
SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ScheduleSpec:
    """When a schedule ticks and what it does with missed ticks (checked by :func:`parse_spec`)."""

    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    missed: str = "skip"
    #: ``catch_up``: at most this many missed ticks run.
    catch_up: int = 10
    #: ``every``: the time its ticks count from (whole seconds).
    anchor: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"cron": self.cron, "every": self.every, "timezone": self.timezone,
                "missed": self.missed, "catch_up": self.catch_up, "anchor": self.anchor}


@dataclass(frozen=True)
class TickPlan:
    """What one pass fires: ``fire`` (oldest first), how many missed ticks it ``skipped``
    (at least), and the schedule's next tick after ``now``."""

    fire: list[float]
    skipped: int
    next_at: float


def parse_spec(args: Mapping[str, Any], now: float) -> ScheduleSpec:
    """A schedule's timing from a command's arguments (``cron`` + ``timezone``, or ``every``;
    ``missed``, ``catch_up``); an interval's anchor is ``now``, to the second.

    Raises:
        InvalidSchedule: naming the bad field (``INVALID_ARGUMENT`` on the wire).
    """
    cron, every = args.get("cron"), args.get("every")
    if (cron is None) == (every is None):
        raise InvalidSchedule("give exactly one of cron and every", field="cron")
    missed = args.get("missed", "skip")
    if missed not in MISSED_POLICIES:
        raise InvalidSchedule(f"missed must be one of {list(MISSED_POLICIES)}", field="missed",
                              value=str(missed)[:40])
    catch_up = args.get("catch_up", 10)
    if isinstance(catch_up, bool) or not isinstance(catch_up, int) \
            or not 1 <= catch_up <= MAX_CATCH_UP:
        raise InvalidSchedule(f"catch_up must be an integer in [1, {MAX_CATCH_UP}]",
                              field="catch_up")
    timezone = args.get("timezone", "UTC")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int | float) \
                or not math.isfinite(every) or every < 1 or every != int(every):
            raise InvalidSchedule("every must be a whole number of seconds >= 1", field="every")
        return ScheduleSpec(every=float(every), missed=missed, catch_up=catch_up,
                            anchor=float(math.floor(now)))
    spec = ScheduleSpec(cron=_checked_cron(cron), timezone=_checked_zone(timezone),
                        missed=missed, catch_up=catch_up)
    try:
        tick_after(spec, now)
    except (ValueError, KeyError, OverflowError) as exc:  # croniter: a date that never comes
        raise InvalidSchedule(f"cron expression {cron!r} never fires: {exc}",
                              field="cron") from None
    return spec


def _checked_cron(cron: Any) -> str:
    from croniter import croniter  # at first use: 10 ms of every node's start otherwise

    if not isinstance(cron, str) or len(cron) > 200 or not croniter.is_valid(cron):
        raise InvalidSchedule(f"invalid cron expression {str(cron)[:200]!r} (five fields:"
                              " minute hour day-of-month month day-of-week)", field="cron")
    return cron


def _checked_zone(timezone: Any) -> str:
    try:
        if not isinstance(timezone, str) or not timezone:
            raise ValueError(timezone)
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(f"unknown time zone {str(timezone)[:64]!r} (an IANA name such"
                              " as Europe/Paris)", field="timezone") from None
    return timezone


def spec_from_dict(data: Mapping[str, Any]) -> ScheduleSpec:
    """The inverse of :meth:`ScheduleSpec.as_dict` (a stored row: checked when created)."""
    return ScheduleSpec(cron=data.get("cron"), every=data.get("every"),
                        timezone=data.get("timezone") or "UTC", missed=data["missed"],
                        catch_up=int(data["catch_up"]), anchor=float(data.get("anchor") or 0))


def _cron_at(spec: ScheduleSpec, t: float) -> croniter:
    from croniter import croniter

    start = datetime.fromtimestamp(t, ZoneInfo(spec.timezone))
    return croniter(spec.cron, start)


def tick_after(spec: ScheduleSpec, t: float) -> float:
    """The schedule's first tick strictly after ``t``."""
    if spec.every is not None:
        k = math.floor((t - spec.anchor) / spec.every) + 1
        return spec.anchor + k * spec.every
    return float(_cron_at(spec, t).get_next(datetime).timestamp())


def _ticks_back(spec: ScheduleSpec, since: float, now: float, limit: int) -> list[float]:
    """The ticks in ``[since, now]``, newest first, at most ``limit`` of them."""
    out: list[float] = []
    if spec.every is not None:
        t = spec.anchor + math.floor((now - spec.anchor) / spec.every) * spec.every
        while t >= since and len(out) < limit:
            out.append(t)
            t -= spec.every
        return out
    # croniter's get_prev is strictly before its start: start just after ``now``.
    it = _cron_at(spec, now + 0.001)
    while len(out) < limit:
        t = float(it.get_prev(datetime).timestamp())
        if t < since:
            break
        out.append(t)
    return out


def plan_ticks(spec: ScheduleSpec, next_at: float, now: float) -> TickPlan:
    """Which of the ticks due since ``next_at`` (the first not yet fired) to fire at ``now``."""
    keep = {"skip": 0, "latest": 1, "catch_up": spec.catch_up}[spec.missed]
    due = _ticks_back(spec, next_at, now, _MAX_ON_TIME + keep + 1)
    on_time = [t for t in due if now - t <= MISSED_GRACE]
    missed = [t for t in due if now - t > MISSED_GRACE]
    if spec.missed == "latest" and on_time:
        keep = 0  # the latest due tick is on time: it is the one run
    fire = sorted(on_time[:_MAX_ON_TIME] + missed[:keep])
    return TickPlan(fire, len(due) - len(fire), tick_after(spec, now))


def tick_key(schedule: str, tick: float) -> str:
    """The idempotency key of a tick's task: ``<schedule>:<UTC time, ISO 8601>``."""
    when = datetime.fromtimestamp(tick, UTC)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S") + (f".{when.microsecond:06d}".rstrip("0")
                                                   if when.microsecond else "") + "Z"
    return f"{schedule}:{stamp}"
