"""Drift reconciliation: a workflow's periodic comparison of what Ratchet recorded of the
external objects its tasks made (the action ledger's results) with what the provider says
now.

    async def claim_now(effect: ratchet.RecordedEffect) -> dict | None:
        return finance.get_claim(effect.result["claim_id"])      # None: gone

    wf = Workflow("expense.file", reconcile=Reconcile(every=3600, check=claim_now,
                                                      tools=("file_claim",)))

Every ``every`` seconds the node holding a task's partition calls ``check`` for each
succeeded write of that workflow's tasks (``tools``: only these tools' writes; empty: all)
and compares the answer with the recorded result: fields that differ (or the whole
object, when either side is not a map) become a ``drift.detected`` event on the task
that made the effect, and a warning in the log. Nothing in the store changes but that
event: the ledger stays the record of what Ratchet did; the event says the world moved
since. The service is ``supervisors/services/drift.py``; docs/side-effects.md, "Drift".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ratchet.protocol.errors import WorkflowDefinitionError

__all__ = ["RecordedEffect", "Reconcile", "difference"]


@dataclass(frozen=True)
class RecordedEffect:
    """One succeeded write as the ledger holds it (what ``check`` is asked about)."""

    tenant: str
    task_id: str
    key: str  # the action's idempotency key
    tool: str
    args: Any
    result: Any
    provider_id: str | None


#: The provider's view of one effect now (None: the provider no longer has it).
Check = Callable[[RecordedEffect], Awaitable[Any] | Any]


@dataclass(frozen=True)
class Reconcile:
    """A workflow's drift reconciliation job.

    Args:
        every: seconds between two passes (>= 1).
        check: the provider's view of one recorded effect (sync or async); a raise counts
            as no answer for that effect this pass (logged), not as drift.
        tools: the tools whose writes are compared (empty: every write).
    """

    every: float
    check: Check
    tools: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.every, int | float) or self.every < 1:
            raise WorkflowDefinitionError(f"reconcile every must be >= 1 s, got {self.every!r}")
        if not callable(self.check):
            raise WorkflowDefinitionError("reconcile check must be callable")


def difference(recorded: Any, seen: Any) -> dict[str, Any]:
    """What differs between the recorded result and the provider's view: per field of a
    map ``{field: {"recorded": a, "provider": b}}`` (a field on one side only counts),
    else the whole value under ``"value"``; empty when they agree."""
    if isinstance(recorded, dict) and isinstance(seen, dict):
        return {str(k): {"recorded": recorded.get(k), "provider": seen.get(k)}
                for k in sorted(set(recorded) | set(seen), key=str)
                if recorded.get(k) != seen.get(k)}
    return {} if recorded == seen else {"value": {"recorded": recorded, "provider": seen}}
