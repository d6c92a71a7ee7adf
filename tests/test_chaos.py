"""The chaos harness, small: SIGKILL real nodes at random points of two-write tasks."""

from __future__ import annotations

import pytest

from bench.chaos import run_chaos

pytestmark = pytest.mark.slow  # real node processes, killed


async def test_killing_nodes_never_doubles_loses_or_drops_an_effect() -> None:
    result = await run_chaos(runs=6, seed=11)
    assert result["runs"] == 6
    assert result["lost_tasks"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    assert result["succeeded"] + result["failed_and_compensated"] + result[
        "unknown_with_handoff"] == 6


async def test_killing_one_of_three_nodes_on_one_store_never_doubles_or_loses_an_effect() -> None:
    # Seed 29 draws each kill point once: before the call, after the provider committed,
    # mid-compensation, and a random moment; odd runs replace the victim under a fresh id
    # (failover to the survivors), even runs restart it under its own.
    result = await run_chaos(runs=4, seed=29, nodes=3)
    assert result["nodes"] == 3
    assert result["kill_points"] == {"before_call": 1, "after_provider_commit": 1,
                                     "mid_compensation": 1, "random": 1}
    assert result["lost_tasks"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    assert result["succeeded"] + result["failed_and_compensated"] + result[
        "unknown_with_handoff"] == 4
