"""What the store ports return and take: task records, loaded state, the fence. Kept apart
from the SQLite store so that the ports (and a second backend) need not import it."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Fence", "LoadedState", "TaskRecord", "fence_keys", "fence_scope"]

#: What the writes made in this context are fenced by, in place of their task's id: a
#: fan-out branch's id (protocol/subjects.py ``branch_id``), set by the branch's own asyncio
#: task, so that every write of the branch — its progress, settlement, tool calls — carries
#: the lease of the partition the branch runs on, not its task's (which another node may
#: hold). A context variable rather than a parameter: the branch's writes go through the
#: action ledger and the tool runners, which know nothing of branches.
#: Several ids: a group commit of branches of several partitions checks each one's lease.
fence_scope: ContextVar[tuple[str, ...] | None] = ContextVar("ratchet_fence_scope",
                                                            default=None)


def fence_keys(task_id: str) -> tuple[str, ...]:
    """What a write of ``task_id`` made in this context is fenced by (:data:`fence_scope`)."""
    return fence_scope.get() or (task_id,)


class Fence(Protocol):
    """Which lease a task's writes carry (the node's lease manager implements it)."""

    def token_for(self, task_id: str) -> tuple[int, int]:
        """``(partition, fencing token)``; raises ``Fenced`` when not held. (Whether the
        lease has run out the store judges on its own time, in the write's transaction.)"""
        ...


@dataclass(frozen=True, slots=True)
class TaskRecord:
    task_id: str
    tenant: str
    workflow: str
    workflow_version: int
    status: str
    version: int
    input: dict[str, Any]
    next_step: int
    steps_total: int | None
    last_checkpoint: int
    last_event_seq: int
    deadline_at: float | None
    created_at: float
    updated_at: float
    error: dict[str, Any] | None
    output: dict[str, Any] | None
    step_failures: int
    current_node: str | None
    visits: dict[str, int]
    budget: dict[str, Any]
    spent: dict[str, float]
    control: dict[str, Any]
    traceparent: str | None = None  # the trace its spans continue (protocol/tracing.py)
    idempotency_key: str = ""  # its submit's key (a span attribute of its steps)
    #: The hash of the definition it started on (actors/workflow/definition.py); None: not
    #: recorded (a task from before migration 20, a fork, a schedule's tick).
    definition_hash: str | None = None
    #: A sandbox fork's marks (persistence/sandbox_rows.py: ``source``, ``lineage``,
    #: ``reuse_model``); None for every other task.
    sandbox: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LoadedState:
    """A task's state at a checkpoint: values, and what a ``StateTracker`` diffs against:
    the encodings of the small ones, the digests of those stored as blobs (key → digest;
    their encodings are not kept)."""

    values: dict[str, Any]
    encoded: dict[str, bytes]
    blobs: dict[str, str]
