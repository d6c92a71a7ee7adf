"""Join decisions as a pure function over the completion set (tested without I/O).

Branch statuses: RUNNING, SUCCEEDED, FAILED, TIMED_OUT (and CANCELLED, for branches the
join no longer needed). A branch is *satisfied* when it SUCCEEDED, or when it did not
(failed, timed out, or still running at the join's timeout) but the policy declares a
default for it: degrade, not fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ratchet.actors.workflow.nodes import JoinPolicy

__all__ = ["JoinVerdict", "decide", "may_decide"]

FINAL = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"})


@dataclass(frozen=True)
class JoinVerdict:
    ok: bool
    reason: str
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)  # took their declared default
    unfinished: list[str] = field(default_factory=list)  # still running: to be cancelled

    def values(self, results: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
        """The join's output: each succeeded branch's result, each degraded one's default."""
        out = {b: results.get(b) for b in self.succeeded}
        out.update({b: defaults[b] for b in self.degraded})
        return out


def may_decide(policy: JoinPolicy, counts: Mapping[str, int], timed_out: bool) -> bool:
    """Whether :func:`decide` can return a verdict, from the number of branches in each
    status alone: False only where it certainly returns None. A join over thousands of
    branches (a map) asks this, in constant time, at every notification, and runs the
    linear ``decide`` only when it is True."""
    if timed_out or not counts.get("RUNNING", 0):
        return True
    if any(counts.get(s, 0) for s in ("FAILED", "TIMED_OUT", "CANCELLED")):
        return True  # a failure may settle it (defaults and optional branches: decide says)
    return policy.mode == "at_least" and counts.get("SUCCEEDED", 0) >= (policy.k or 0) > 0


def decide(policy: JoinPolicy, statuses: Mapping[str, str], timed_out: bool) -> JoinVerdict | None:
    """The verdict, or None while the join must keep waiting.

    ``timed_out``: the join's own timeout passed; running branches count as timed out.
    """
    succeeded = sorted(b for b, s in statuses.items() if s == "SUCCEEDED")
    failed = sorted(b for b, s in statuses.items() if s == "FAILED")
    late = sorted(b for b, s in statuses.items() if s == "TIMED_OUT"
                  or (timed_out and s == "RUNNING"))
    running = sorted(b for b, s in statuses.items() if s == "RUNNING" and not timed_out)
    not_ok = failed + late

    def verdict(ok: bool, reason: str, degraded: list[str] | None = None) -> JoinVerdict:
        return JoinVerdict(ok, reason, succeeded, failed, late, sorted(degraded or []),
                           sorted(b for b, s in statuses.items() if s == "RUNNING"))

    if policy.mode == "at_least":
        k = policy.k or len(statuses)
        if len(succeeded) >= k:
            return verdict(True, f"{len(succeeded)} of {len(statuses)} succeeded (needed {k})")
        if len(succeeded) + len(running) < k:
            return verdict(False, f"only {len(succeeded)} can succeed; {k} needed",
                           [b for b in not_ok if b in policy.defaults])
        return None

    required = set(statuses) if policy.mode == "all" else set(policy.required)
    bad_required = [b for b in not_ok if b in required and b not in policy.defaults]
    if bad_required:
        return verdict(False, f"required branches did not succeed: {bad_required}")
    if running:
        return None
    degraded = [b for b in not_ok if b in policy.defaults]
    reason = "all branches finished" if not timed_out else "join timed out"
    return verdict(True, reason + (f"; degraded {degraded}" if degraded else ""), degraded)
