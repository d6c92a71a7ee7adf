"""A workflow that sleeps between two steps, for ``ratchet serve --app tests.sleep_apps:app``
(tests/test_durable_sleep.py kills that process during the sleep). Step executions are
appended to ``RATCHET_TEST_STEP_LOG`` (one line each), to be counted across processes."""

from __future__ import annotations

import os
from typing import Any

import ratchet


def _log(ctx: ratchet.StepContext) -> None:
    path = os.environ.get("RATCHET_TEST_STEP_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{ctx.task_id} {ctx.step_name}\n")


nap = ratchet.Workflow("nap.short", version=1)


@nap.step
async def before(ctx: ratchet.StepContext) -> dict[str, Any]:
    _log(ctx)
    return {}


nap.sleep("nap", seconds=3.0)


@nap.step
async def after(ctx: ratchet.StepContext) -> dict[str, Any]:
    _log(ctx)
    return {"output": {"done": True}}


app = ratchet.Registry([nap])
