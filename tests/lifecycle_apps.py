"""A workflow whose one step never returns (and asks for no timeout), served by
``ratchet serve --app tests.lifecycle_apps:app`` in the lifecycle tests. The step touches
``$RATCHET_TEST_HANG_MARK`` once it runs, so a test knows the node is inside it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import ratchet

hangs = ratchet.Workflow("hangs", step_timeout=None)  # unbounded: asked for


@hangs.step
async def hang(ctx: ratchet.StepContext) -> dict[str, object]:
    mark = os.environ.get("RATCHET_TEST_HANG_MARK")
    if mark:
        Path(mark).touch()
    await asyncio.Event().wait()  # never set
    return {}


app = ratchet.Registry([hangs])
