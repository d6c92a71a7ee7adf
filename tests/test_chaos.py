"""The chaos harness, small: SIGKILL real nodes at random points of two-write tasks."""

from __future__ import annotations

from bench.chaos import run_chaos


async def test_killing_nodes_never_doubles_loses_or_drops_an_effect() -> None:
    result = await run_chaos(runs=6, seed=11)
    assert result["runs"] == 6
    assert result["lost_tasks"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    assert result["succeeded"] + result["failed_and_compensated"] + result[
        "unknown_with_handoff"] == 6
