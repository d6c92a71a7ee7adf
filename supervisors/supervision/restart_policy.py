"""Supervisor policy as data and pure functions (Erlang/OTP semantics).

Restart types: ``permanent`` children are always restarted; ``transient`` ones only
after an abnormal exit; ``temporary`` ones never. Intensity: more than ``max_restarts``
restarts within ``period`` seconds makes the supervisor give up and escalate to its
parent. Restarts are delayed by exponential backoff with full jitter.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from ratchet.actors.core.backoff import backoff_delay

__all__ = ["Restart", "Strategy", "should_restart", "intensity_exceeded", "backoff_delay"]


class Restart(StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class Strategy(StrEnum):
    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


#: restart type × (exit was abnormal) -> restart?
_RESTART_TABLE: dict[tuple[Restart, bool], bool] = {
    (Restart.PERMANENT, False): True,
    (Restart.PERMANENT, True): True,
    (Restart.TRANSIENT, False): False,
    (Restart.TRANSIENT, True): True,
    (Restart.TEMPORARY, False): False,
    (Restart.TEMPORARY, True): False,
}


def should_restart(restart: Restart, abnormal: bool) -> bool:
    return _RESTART_TABLE[(restart, abnormal)]


def intensity_exceeded(
    restarts: Sequence[float], now: float, max_restarts: int, period: float
) -> bool:
    """True when more than ``max_restarts`` of ``restarts`` (times) fall within ``period``."""
    recent = [t for t in restarts if now - t < period]
    return len(recent) > max_restarts
