"""A warning in the log for a step still running past a share of its timeout.

A step that hangs is otherwise silent until its timeout fails it (by default 600 s:
actors/workflow/nodes.py ``DEFAULT_STEP_TIMEOUT``). At ``SLOW_STEP_SHARE`` of the timeout
the task actor logs what an operator needs to find it — the task, the step, its attempt,
how long it has run and when it will time out — once per attempt. Loop time, as the
step's own ``asyncio.timeout``: the warning and the timeout agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["SLOW_STEP_SHARE", "warn_if_slow"]

#: The share of a step's timeout after which it is reported as running long.
SLOW_STEP_SHARE = 0.5


@asynccontextmanager
async def warn_if_slow(log: Any, timeout: float | None, attempt: int) -> AsyncIterator[None]:
    """Around one run of a step: ``log`` (bound to the task and the step) gets a warning
    if the run is still going at ``SLOW_STEP_SHARE`` of ``timeout`` (None: never)."""
    if timeout is None:
        yield
        return
    loop = asyncio.get_running_loop()
    started = loop.time()

    def warn() -> None:  # runs as a loop callback: log only, never raise
        elapsed = loop.time() - started
        log.warning("step running long", attempt=attempt, elapsed_s=round(elapsed, 3),
                    timeout_s=timeout, times_out_in_s=round(timeout - elapsed, 3))

    handle = loop.call_later(timeout * SLOW_STEP_SHARE, warn)
    try:
        yield
    finally:
        handle.cancel()
