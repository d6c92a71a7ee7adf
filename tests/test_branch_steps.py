"""A fan-out branch commits its progress step by step: SIGKILL a node in the middle of
ten-step branches, restart it, and no committed step of any branch runs again — at most the
one that was in flight — while every branch goes on from the state it had committed."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import ratchet
from tests.branch_apps import STEPS
from tests.conftest import NodeProcess, assert_contiguous, wait_terminal

pytestmark = pytest.mark.slow  # a real node process, killed


def step_runs(log: Path) -> Counter[tuple[str, int]]:
    """How often each (branch, step) ran, from the step log."""
    runs: Counter[tuple[str, int]] = Counter()
    for line in log.read_text().splitlines():
        _, branch, step, _ = line.split()
        runs[(branch, int(step))] += 1
    return runs


async def test_a_branch_interrupted_by_sigkill_resumes_after_its_last_committed_step(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    tmp_path: Path,
) -> None:
    log = tmp_path / "steps.log"
    node = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(log)},
                        app_spec="tests.branch_apps:app")
    await asyncio.to_thread(node.start)
    task_id = (await client.submit("steps.fan", {"sleep": 0.15}, key="steps")).task_id
    async for event in client.watch(task_id):
        # Killed once a branch has committed 7 of its 10 steps (and runs its 8th).
        if event.type == "branch.step_completed" and event.payload["steps"] >= 7:
            break
    await asyncio.to_thread(node.kill)
    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id, timeout=60)
    assert_contiguous(events)
    assert events[-1].type == "task.succeeded", events[-1]
    joined = events[-1].payload["output"]["joined"]
    # Each branch went on from the state it had committed: every step's mark once.
    assert {b: r["done"] for b, r in joined.items()} == {
        f"b{i}": list(range(STEPS)) for i in range(4)}
    runs = step_runs(log)
    assert set(runs) == {(f"b{i}", s) for i in range(4) for s in range(STEPS)}
    rerun = [key for key, n in runs.items() if n > 1]
    assert max(runs.values()) <= 2, runs
    # At most the step in flight ran twice, per branch; a branch rerun from its start would
    # show all of its first 7 steps twice.
    assert len(rerun) <= 4 and len({b for b, _ in rerun}) == len(rerun), rerun
    checkpoints = [(e.payload["branch"], e.payload["steps"]) for e in events
                   if e.type == "branch.step_completed"]
    assert len(checkpoints) == len(set(checkpoints)) == 4 * (STEPS - 1)
    assert any(e.type == "task.recovered" for e in events)
