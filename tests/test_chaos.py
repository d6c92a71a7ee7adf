"""The chaos harness, small: SIGKILL real nodes at random points of two-write tasks, and
strike the other fault kinds (clock steps, a deleted database, a full disk, purged streams)."""

from __future__ import annotations

import pytest

from bench.chaos import run_chaos
from bench.faults import FAULT_KINDS

pytestmark = pytest.mark.slow  # real node processes, killed


async def test_killing_nodes_never_doubles_loses_or_drops_an_effect() -> None:
    result = await run_chaos(runs=6, seed=11)
    assert result["runs"] == 6
    assert result["lost_tasks"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    assert result["unsettled_actions_after_run"] == 0
    assert result["succeeded"] + result["failed_and_compensated"] + result[
        "cancelled_and_compensated"] + result["unknown_with_handoff"] == 6


async def test_killing_one_of_three_nodes_on_one_store_never_doubles_or_loses_an_effect() -> None:
    # Seed 29 draws each kill point once: before the call, after the provider committed,
    # mid-compensation, and a random moment; odd runs replace the victim under a fresh id
    # (failover to the survivors), even runs restart it under its own.
    result = await run_chaos(runs=4, seed=29, nodes=3, points=(
        "before_call", "after_provider_commit", "mid_compensation", "random"))
    assert result["nodes"] == 3
    assert result["kill_points"] == {"before_call": 1, "after_provider_commit": 1,
                                     "mid_compensation": 1, "random": 1}
    assert result["lost_tasks"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    assert result["succeeded"] + result["failed_and_compensated"] + result[
        "unknown_with_handoff"] == 4


async def test_a_rerun_on_another_path_and_a_cancel_mid_call_leave_no_write_unsettled() -> None:
    # rerun_detour: killed after the provider committed the hotel claim; the re-run looks
    # the claim up and does not submit it again, so only the recovery's settling records
    # it. cancel_during_call: the cancel waits for the claim in flight, then refunds.
    result = await run_chaos(runs=4, seed=3, points=("rerun_detour", "cancel_during_call"))
    assert set(result["kill_points"]) == {"rerun_detour", "cancel_during_call"}
    assert result["lost_tasks"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    assert result["unsettled_actions_after_run"] == 0


async def test_each_other_fault_kind_loses_no_acknowledged_task_and_doubles_no_effect() -> None:
    # One run per kind: the clock stepped +1 h and -1 h (libfaketime), the database file
    # deleted, the disk full (tmpfs), RATCHET_MAIL and RATCHET_SUBMIT purged; a kind that
    # cannot run here (no root for the tmpfs, no libfaketime) is skipped and says why.
    result = await run_chaos(runs=len(FAULT_KINDS), seed=13, faults=FAULT_KINDS)
    ran = set(FAULT_KINDS) - set(result["skipped_faults"])
    assert result["runs"] == len(FAULT_KINDS)
    assert set(result["runs_by_fault"]) == ran  # the kinds take turns
    assert result["probes_acked"] > 0
    assert result["lost_tasks"] == 0
    assert result["acked_then_lost"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    seen = result["faults_seen"]
    # A kind that cannot run here leaves its turn to the others: count each kind's runs.
    times = result["runs_by_fault"]
    if "db_deleted" in ran:
        assert seen["db_deleted"]["exit_code"] == {"1": times["db_deleted"]}
        assert seen["db_deleted"]["db_put_back"] == {"True": times["db_deleted"]}
    if "disk_full" in ran:
        assert seen["disk_full"]["resumed"] == {"True": times["disk_full"]}
    for kind in {"clock_forward", "clock_back"} & ran:
        assert seen[kind]["steps_detected"] == seen[kind]["steps_made"] == 2
    # The purge finds submits queued (published on JetStream, not yet accepted): every one
    # of them is either in the store, settled, or among those the purge removed.
    assert seen["purge_submit"]["purged_messages"] > 0
    assert seen["purge_submit"]["burst_lost"] <= seen["purge_submit"]["purged_messages"]
    assert result["submits_lost_unpurged"] == 0
