"""Circuit breakers: a failing provider is not hammered by every task that needs it.

One breaker per (tenant, provider) on each node; a tool's provider is its ``breaker.group``
(default: the tool's name), so the tools of one payment API can share one breaker. The
states are the usual three:

- **closed**: calls go through; each transient failure (a 5xx, a timeout, an unknown
  outcome, a rate limit) is counted, and ``failures`` of them within ``window`` seconds
  open the breaker. A success, or an answer that shows the provider working (a 4xx: the
  request was wrong, not the provider), forgets the failures.
- **open**: no call is made; the action sees a retryable ``CIRCUIT_OPEN`` with
  ``retry_after`` = what is left of ``cooldown``, so its retries wait for the provider
  instead of adding to the storm (a write's IN_FLIGHT row was committed, but nothing was
  sent: it goes back to PENDING like any retry).
- **half-open**: after ``cooldown``, one call at a time is let through as a probe; the
  others keep seeing ``CIRCUIT_OPEN`` (``retry_after`` = the probe's timeout). The probe's
  success closes the breaker; its failure opens it for another ``cooldown``.

Breakers are per node and in memory, as in every library of the kind: a node that has not
seen the provider fail keeps calling it; a restarted node starts closed. Time is the
caller's monotonic clock (a wall-clock step neither opens nor closes one). Memory: a
breaker is dropped as soon as it is closed with no failure counted, so the table holds
only the providers that failed within the last ``window`` (or are open).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ratchet.actors.effects.action_reports import error_of
from ratchet.actors.workflow.tools import BreakerPolicy, Decision, Tool, classify
from ratchet.protocol.errors import ActionFailed, ErrorCode, ToolCircuitOpen, ToolDeadlineExceeded

__all__ = ["BreakerState", "CircuitBreakers", "circuit_open_failure", "through_breaker"]

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class BreakerState:
    cooldown: float
    failures: deque[float] = field(default_factory=deque)  # monotonic times, oldest first
    opened_at: float | None = None
    probing: bool = False
    trips: int = 0  # times it opened since the node started

    def state(self, now: float) -> str:
        if self.opened_at is None:
            return "closed"
        return "open" if now - self.opened_at < self.cooldown else "half-open"


class CircuitBreakers:
    """The node's breakers, asked before every tool call and told its outcome after."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, str], BreakerState] = {}

    def check(self, tenant: str, group: str, now: float,
              probe_timeout: float) -> ToolCircuitOpen | None:
        """Why a call may not go now, or None (without taking the probe's turn)."""
        st = self._states.get((tenant, group))
        if st is None or st.opened_at is None:
            return None
        left = st.cooldown - (now - st.opened_at)
        if left > 0:
            return ToolCircuitOpen(f"circuit open for {group}: next probe in {left:.1f} s",
                                   retry_after=left, provider=group)
        if st.probing:
            return ToolCircuitOpen(f"circuit half-open for {group}: a probe is in flight",
                                   retry_after=probe_timeout, provider=group)
        return None

    def admit(self, tenant: str, group: str, now: float, probe_timeout: float) -> None:
        """Let a call through, or raise :class:`ToolCircuitOpen`. When half-open, the call
        let through is the probe: the others wait for its outcome."""
        refusal = self.check(tenant, group, now, probe_timeout)
        if refusal is not None:
            raise refusal
        st = self._states.get((tenant, group))
        if st is not None and st.opened_at is not None:
            st.probing = True

    def succeeded(self, tenant: str, group: str) -> None:
        """A call that shows the provider working: closes the breaker, forgets failures."""
        st = self._states.pop((tenant, group), None)
        if st is not None and st.opened_at is not None:
            log.info("breaker closed", tenant=tenant, provider=group, trips=st.trips)

    def failed(self, tenant: str, group: str, policy: BreakerPolicy, now: float) -> None:
        """A transient failure of a call that was let through."""
        st = self._states.get((tenant, group))
        if st is None:
            st = self._states[(tenant, group)] = BreakerState(
                policy.cooldown, deque(maxlen=policy.failures))
        if st.opened_at is not None:  # the probe, or a call let through before it opened
            if st.probing:
                st.probing, st.opened_at, st.trips = False, now, st.trips + 1
                log.warning("breaker opened again: the probe failed", tenant=tenant,
                            provider=group, cooldown_s=policy.cooldown)
            return
        st.failures.append(now)
        while st.failures and now - st.failures[0] > policy.window:
            st.failures.popleft()
        if len(st.failures) >= policy.failures:
            st.opened_at, st.trips = now, st.trips + 1
            log.warning("breaker opened", tenant=tenant, provider=group,
                        failures=len(st.failures), window_s=policy.window,
                        cooldown_s=policy.cooldown)

    def released(self, tenant: str, group: str) -> None:
        """The probe ended without an answer (cancelled): the next call may probe."""
        st = self._states.get((tenant, group))
        if st is not None:
            st.probing = False

    def snapshot(self, tenant: str | None, now: float) -> list[dict[str, object]]:
        """The breakers of ``tenant`` (None: every tenant's) with a failure or open, for
        admins."""
        out: list[dict[str, object]] = []
        for (t, group), st in sorted(self._states.items()):
            if tenant is not None and t != tenant:
                continue
            row: dict[str, object] = {"tenant": t, "provider": group, "state": st.state(now),
                                      "recent_failures": len(st.failures), "trips": st.trips}
            if st.opened_at is not None:
                row["opened_s_ago"] = round(now - st.opened_at, 3)
                row["probe_in_s"] = round(max(0.0, st.cooldown - (now - st.opened_at)), 3)
            out.append(row)
        return out


async def through_breaker(breakers: CircuitBreakers, tenant: str, tool: Tool[Any, Any],
                          monotonic: Callable[[], float],
                          call: Callable[[], Awaitable[tuple[bool, Any]]]) -> tuple[bool, Any]:
    """Make one call of ``tool`` if its breaker lets it, and tell the breaker how it went.
    Refused: ``(False, ToolCircuitOpen)``, which the action's retry policy waits out."""
    assert tool.breaker is not None
    provider = tool.provider
    try:
        breakers.admit(tenant, provider, monotonic(), tool.timeout)
    except ToolCircuitOpen as refusal:
        return (False, refusal)
    told = False
    try:
        ok, value = await call()
        decision = None if ok else classify(value, tool.kind)
        if decision is None or (decision is Decision.FAIL
                                and not isinstance(value, ToolDeadlineExceeded)):
            breakers.succeeded(tenant, provider)  # it answered, if only with a 4xx
            told = True
        elif decision is not Decision.FAIL:
            breakers.failed(tenant, provider, tool.breaker, monotonic())
            told = True
        return (ok, value)
    finally:
        if not told:  # cancelled, or out of time before an answer: tells nothing
            breakers.released(tenant, provider)


def circuit_open_failure(tool: str, refusal: ToolCircuitOpen) -> ActionFailed:
    """The failure of a new call refused by an open breaker: retryable, CIRCUIT_OPEN."""
    failure = ActionFailed(f"{tool}: {refusal.message}", tool=tool, retryable=True,
                           retry_after=refusal.retry_after,
                           error=error_of(refusal))
    failure.code = ErrorCode.CIRCUIT_OPEN
    return failure
