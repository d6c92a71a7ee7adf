"""Workflows the tests serve (in-process, and via ``ratchet serve --app tests.apps:app``).

Step executions are counted in :data:`RUNS` (in-process) and, when
``RATCHET_TEST_STEP_LOG`` is set, appended to that file (one line per execution) so a test
can count executions across processes killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

import ratchet

RUNS: Counter[str] = Counter()
#: Steps that must raise on their first execution: names of (task_id, step) pairs seen.
FAIL_ONCE: set[str] = set()


def _record(ctx: ratchet.StepContext) -> None:
    RUNS[f"{ctx.task_id}:{ctx.step_name}"] += 1
    path = os.environ.get("RATCHET_TEST_STEP_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{ctx.task_id} {ctx.step_name}\n")
            fh.flush()


def _counting_workflow(name: str, steps: int) -> ratchet.Workflow:
    wf = ratchet.Workflow(name, version=1)
    for i in range(steps):
        async def step(ctx: ratchet.StepContext, i: int = i) -> dict[str, Any]:
            delay = float(ctx.input.get("sleep", 0))
            if delay:
                await asyncio.sleep(delay)
            _record(ctx)
            if ctx.input.get("fail_once_at") == i and ctx.attempt == 1:
                raise RuntimeError(f"step {i} fails on its first attempt")
            if ctx.input.get("always_fail_at") == i:
                raise RuntimeError(f"step {i} always fails")
            return {"count": ctx.state.get("count", 0) + 1, f"s{i}": i}

        wf.add_step(f"s{i}", step)

    async def finish(ctx: ratchet.StepContext) -> dict[str, Any]:
        _record(ctx)
        return {"output": {"count": ctx.state.get("count", 0)}}

    wf.add_step("finish", finish)
    return wf


three = _counting_workflow("three", 3)
ten = _counting_workflow("ten", 10)
twenty = _counting_workflow("twenty", 20)

app = ratchet.Registry([three, ten, twenty])
