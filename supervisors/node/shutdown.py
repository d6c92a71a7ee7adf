"""A node's clean stop, after its intake and routers: the drain, bounded, and the closing
stages, each run whatever happened before it.

The drain stops the root supervisor's children in order (no new work first, the tasks
last: each stops at its next step boundary, its safe point), flushes the outbox and
releases the leases, all within one bound (``NodeConfig.drain_timeout``, ``serve
--drain-timeout``); :meth:`Drain.hurry` (a second Ctrl-C) ends the bound at once. What has
not stopped by then is stopped by the root supervisor without waiting for a safe point:
its tasks resume from their checkpoints at the next start, or on another node. After an
incomplete drain the root is given ``AFTER_INCOMPLETE_DRAIN`` seconds, not the usual 15:
what did not stop within the bound will not stop by waiting longer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from ratchet.actors.core.actor import ActorRef
from ratchet.supervisors.node.leases import LeaseManager
from ratchet.supervisors.services.outbox_relay import OutboxRelay
from ratchet.supervisors.supervision.supervisor import StopChild, Supervisor

__all__ = ["AFTER_DRAIN", "AFTER_INCOMPLETE_DRAIN", "Drain", "close_in_order"]

log = structlog.get_logger("ratchet.node")

#: Seconds the root supervisor has to stop the rest after a drain, complete or not; past
#: them it is killed (its children cancelled).
AFTER_DRAIN = 15.0
AFTER_INCOMPLETE_DRAIN = 1.0

#: The root's children in the order they stop: no new work first, the tasks last.
STOP_ORDER = ("intake", "decisions", "external", "recovery", "retention", "timers", "mail",
              "admin", "api", "tasks")


class Drain:
    """One node's drain; ``run`` once, ``hurry`` from a signal handler at any time."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._scope: asyncio.Timeout | None = None
        self._hurried = False

    async def run(self, root: ActorRef[Supervisor], relay: OutboxRelay | None,
                  leases: LeaseManager | None) -> bool:
        """Stop the children in order, flush the outbox, release the leases; a failure or
        the bound ends it with a warning (``drain incomplete``), never an exception.
        Returns whether it completed."""
        try:
            async with asyncio.timeout(0 if self._hurried else self.timeout) as self._scope:
                for child in STOP_ORDER:
                    self._unless_hurried(child)
                    await root.ask(StopChild(child), timeout=self.timeout)
                self._unless_hurried("outbox")
                if relay is not None:
                    await relay.flush(timeout=5.0)
                if leases is not None:
                    await leases.release_all()  # the others take the partitions now
        except Exception as exc:
            log.warning("drain incomplete", error=repr(exc), bound=self.timeout)
            return False
        return True

    def _unless_hurried(self, stage: str) -> None:
        # The hurry's cancellation can be lost: Python 3.11's wait_for (inside ask) returns
        # the answer instead of raising when the answer and the cancellation arrive in the
        # same turn of the loop, and the drain would go on to wait for the tasks' full bound.
        if self._hurried:
            raise TimeoutError(f"drain cut short before {stage}")

    def hurry(self) -> None:
        """End the drain's bound now (before it began: it will not wait at all)."""
        self._hurried = True
        if self._scope is not None:
            with contextlib.suppress(RuntimeError):  # the drain is over already
                self._scope.reschedule(asyncio.get_running_loop().time())


async def close_in_order(stages: list[tuple[str, Callable[[], Awaitable[None]] | None]]) -> None:
    """Run each closing stage (None: nothing to close) even if an earlier one failed (NATS
    gone, a child stuck): the store must close (its threads would keep the process alive)
    and the embedded server must stop."""
    for stage, close in stages:
        if close is None:
            continue
        try:
            await close()
        except Exception as exc:
            log.warning("shutdown stage failed", stage=stage, error=repr(exc))
