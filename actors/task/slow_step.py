"""A warning in the log for a step still running past a share of its timeout.

A step that hangs is otherwise silent until its timeout fails it (by default 600 s:
actors/workflow/nodes.py ``DEFAULT_STEP_TIMEOUT``). At ``SLOW_STEP_SHARE`` of the timeout
the task actor logs what an operator needs to find it — the task, the step, its attempt,
how long it has run and when it will time out — once per attempt. Loop time, as the
step's own ``asyncio.timeout``: the warning and the timeout agree.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["SLOW_STEP_SHARE", "SlowStepWarning", "warn_if_slow"]

#: The share of a step's timeout after which it is reported as running long.
SLOW_STEP_SHARE = 0.5


def warn_if_slow(log: Any, timeout: float | None, attempt: int) -> SlowStepWarning:
    """Around one run of a step: ``log`` (bound to the task and the step) gets a warning
    if the run is still going at ``SLOW_STEP_SHARE`` of ``timeout`` (None: never)."""
    return SlowStepWarning(log, timeout, attempt)


class SlowStepWarning:
    """The context manager of :func:`warn_if_slow`: a class, not a generator, as it is
    entered at every step (a generator-based one cost ~3 µs more)."""

    __slots__ = ("_handle", "_started", "attempt", "log", "timeout")

    def __init__(self, log: Any, timeout: float | None, attempt: int) -> None:
        self.log, self.timeout, self.attempt = log, timeout, attempt
        self._handle: asyncio.TimerHandle | None = None
        self._started = 0.0

    async def __aenter__(self) -> None:
        if self.timeout is not None:
            loop = asyncio.get_running_loop()
            self._started = loop.time()
            self._handle = loop.call_later(self.timeout * SLOW_STEP_SHARE, self._warn)

    async def __aexit__(self, *exc_info: object) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def _warn(self) -> None:  # runs as a loop callback: log only, never raise
        assert self.timeout is not None
        elapsed = asyncio.get_running_loop().time() - self._started
        self.log.warning("step running long", attempt=self.attempt,
                         elapsed_s=round(elapsed, 3), timeout_s=self.timeout,
                         times_out_in_s=round(self.timeout - elapsed, 3))
