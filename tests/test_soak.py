"""A minute of steady load on a real node: the WAL and the node's memory stay bounded.

The short version of ``bench/soak.py`` (whose ten-minute figures are in
docs/operations.md); its bounds are loose on purpose: it guards against unbounded growth
(before the WAL guard, the WAL passed 2 GB within this minute), not against noise."""

from __future__ import annotations

import pytest

from bench.soak import run_soak

pytestmark = pytest.mark.slow


async def test_a_minute_of_steady_load_keeps_the_wal_and_memory_bounded_and_loses_nothing(
) -> None:
    result = await run_soak(rate=150, seconds=60, warmup=10)
    assert result["tasks_submitted"] >= 8_900
    assert result["lost_tasks"] == 0
    assert result["tasks_not_succeeded"] == 0
    assert result["wal_peak_mb"] < 200
    assert result["wal_restarts"] > 0
    assert result["rss_growth_mb"] < 20
