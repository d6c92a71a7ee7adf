"""Exponential backoff with full jitter (one pure function, shared by supervisors and the
action protocol)."""

from __future__ import annotations

import random

__all__ = ["backoff_delay"]


def backoff_delay(
    attempt: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    ceiling = min(cap, base * (2 ** max(0, min(attempt, 60))))
    return (rng or random).uniform(0.0, ceiling)
