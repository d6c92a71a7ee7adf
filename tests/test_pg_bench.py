"""The PostgreSQL modes of the bench scripts, small: ``bench/nodes.py --store postgres``'s
throughput part (real nodes on a real PostgreSQL, metered) and what it concludes from its
measurements, and ``bench/chaos.py --store postgres`` with a PostgreSQL restart among the
faults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.chaos import run_chaos
from bench.nodes import throughput
from bench.nodes_pg import scaling_bound
from bench.pg_view import node_dsn, postmaster_pid
from ratchet.testing.pg import PgServer


def _run(rate: float, machine: float, states: dict[str, float]) -> dict[str, Any]:
    return {"tasks_per_s": rate, "pg_backends_mean": {"idle": 5.0, **states},
            "cpu_pct": {"machine": machine, "seconds": {"n1": 1.0, "postgres": 0.5,
                                                        "nats": 0.1, "bench": 0.1}}}


def test_the_scaling_bound_is_the_cpu_when_the_machine_was_saturated() -> None:
    bound = scaling_bound({1: _run(80, 120, {"cpu": 1.0}),
                           3: _run(100, 195, {"lock_wait": 2.0, "cpu": 0.1})}, cores=2)
    assert bound["pg_scaling_bound"].startswith("CPU-bound")
    assert bound["pg_lock_wait_share_3"] == pytest.approx(0.952, abs=0.001)
    assert bound["pg_scaling_cpu_share_3"]["postgres"] == pytest.approx(0.294, abs=0.001)


def test_the_scaling_bound_names_row_locks_or_round_trips_when_the_cpu_had_room() -> None:
    locks = scaling_bound({3: _run(100, 90, {"lock_wait": 1.0, "cpu": 0.5})}, cores=2)
    trips = scaling_bound({3: _run(100, 90, {"in_txn_waiting_for_node": 2.0,
                                             "cpu": 0.2})}, cores=2)
    assert locks["pg_scaling_bound"].startswith("row-lock-bound")
    assert trips["pg_scaling_bound"].startswith("round-trip-bound")


def test_each_node_session_is_named_after_its_node() -> None:
    assert node_dsn("postgresql://u@/db?host=/tmp", "n1").endswith("&application_name=n1")
    assert node_dsn("postgresql://u@h/db", "n 2") == "postgresql://u@h/db?application_name=n%202"


@pytest.mark.slow
async def test_two_nodes_on_postgresql_finish_every_task_and_the_run_is_metered(
        tmp_path: Path) -> None:
    with PgServer() as pg:
        r = await throughput(tmp_path, 2, 60, "loop", store_url=pg.database("tp"),
                             pg_pid=postmaster_pid(pg.pgdata))
    assert r["tasks_per_s"] > 0  # every one of the 60 SUCCEEDED (throughput waits for it)
    seconds = r["cpu_pct"]["seconds"]
    assert set(seconds) == {"n1", "n2", "nats", "bench", "postgres"}
    assert seconds["postgres"] > 0 and seconds["n1"] > 0 and seconds["n2"] > 0
    assert r["pg_wait_samples"] > 0
    assert set(r["commits"]) == {"n1", "n2"}


@pytest.mark.slow
async def test_chaos_on_postgresql_rides_out_a_database_restart_and_node_kills() -> None:
    # Kill points only (no operator cancel), so the 4th strike is the PostgreSQL restart.
    result = await run_chaos(runs=4, seed=7, store="postgres", points=(
        "before_call", "after_provider_commit", "random"))
    assert result["faults_by_kind"] == {"node_kill": 3, "pg_restart": 1}
    assert result["pg_restarts"] == 1
    assert result["lost_tasks"] == 0
    assert result["double_effects"] == 0
    assert result["missing_effects"] == 0
    assert result["event_gaps"] == 0
    assert result["succeeded"] + result["failed_and_compensated"] + result[
        "unknown_with_handoff"] == 4
