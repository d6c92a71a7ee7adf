"""The task state machine: one table, shared by code, docs and tests.

States are what a task *is*; events are facts the runtime records. Requests such as
"cancel requested" are flags on the task until a safe point turns them into an event.
The table is data (:data:`TRANSITIONS`) and :func:`transition` is the only way the runtime
changes a task's status.
"""

from __future__ import annotations

from enum import StrEnum

from ratchet.protocol.errors import IllegalTransition

__all__ = ["TaskStatus", "TaskEvent", "TRANSITIONS", "TERMINAL", "transition", "is_terminal"]


class TaskStatus(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    WAITING_EXTERNAL = "WAITING_EXTERNAL"
    WAITING_APPROVAL = "WAITING_APPROVAL"
    PAUSED = "PAUSED"
    #: Parked at a sleep node until its durable timer (actors/task/sleep_node.py).
    SLEEPING = "SLEEPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"


class TaskEvent(StrEnum):
    DISPATCHED = "dispatched"
    PAUSED = "paused"
    RESUMED = "resumed"
    WAITING_EXTERNAL = "waiting_external"
    EXTERNAL_RESOLVED = "external_resolved"
    WAITING_APPROVAL = "waiting_approval"
    APPROVAL_DECIDED = "approval_decided"
    APPROVAL_TIMED_OUT = "approval_timed_out"
    SLEPT = "slept"
    WOKE = "woke"
    REQUEUED = "requeued"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RECONCILED = "reconciled"
    HUMAN_RESOLVED = "human_resolved"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


S, E = TaskStatus, TaskEvent

TERMINAL: frozenset[TaskStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})

_WAITING = (S.WAITING_EXTERNAL, S.WAITING_APPROVAL, S.SLEEPING)

#: ``(from_status, event) -> to_status``. Anything absent is illegal; terminal states have
#: no outgoing entries at all, which is what makes them absorbing.
TRANSITIONS: dict[tuple[TaskStatus, TaskEvent], TaskStatus] = {
    (S.QUEUED, E.DISPATCHED): S.RUNNING,
    (S.QUEUED, E.PAUSED): S.PAUSED,
    (S.RUNNING, E.PAUSED): S.PAUSED,
    # A pause while sleeping: the wake time stays; resumed after it, the task goes on.
    (S.SLEEPING, E.PAUSED): S.PAUSED,
    (S.PAUSED, E.RESUMED): S.QUEUED,
    (S.RUNNING, E.WAITING_EXTERNAL): S.WAITING_EXTERNAL,
    (S.WAITING_EXTERNAL, E.EXTERNAL_RESOLVED): S.RUNNING,
    (S.RUNNING, E.WAITING_APPROVAL): S.WAITING_APPROVAL,
    (S.WAITING_APPROVAL, E.APPROVAL_DECIDED): S.RUNNING,
    # No decision in time, and the graph declares where to escalate (another approver group).
    (S.WAITING_APPROVAL, E.APPROVAL_TIMED_OUT): S.RUNNING,
    (S.RUNNING, E.SLEPT): S.SLEEPING,
    # The sleep's timer fired: its wake time, or the task's deadline, came.
    (S.SLEEPING, E.WOKE): S.RUNNING,
    (S.RUNNING, E.REQUEUED): S.QUEUED,
    (S.RUNNING, E.OUTCOME_UNKNOWN): S.UNKNOWN,
    # A confirmation that never came and a query that cannot decide: a human must look.
    (S.WAITING_EXTERNAL, E.OUTCOME_UNKNOWN): S.UNKNOWN,
    (S.UNKNOWN, E.RECONCILED): S.RUNNING,
    (S.UNKNOWN, E.HUMAN_RESOLVED): S.RUNNING,
    # A handoff with no pending approval (a failed undo) settled by a human, or a step
    # skipped at a handoff (admin resolve, skip-step).
    (S.WAITING_APPROVAL, E.HUMAN_RESOLVED): S.RUNNING,
    (S.RUNNING, E.SUCCEEDED): S.SUCCEEDED,
    # QUEUED → FAILED: a task that can never start (its workflow is gone, its deadline
    # passed in the queue, its supervisor gave up before the first step).
    **{(src, E.FAILED): S.FAILED for src in (S.QUEUED, S.RUNNING, *_WAITING, S.UNKNOWN)},
    **{
        (src, E.CANCELLED): S.CANCELLED
        for src in (S.QUEUED, S.RUNNING, *_WAITING, S.PAUSED, S.UNKNOWN)
    },
}


def is_terminal(status: TaskStatus) -> bool:
    """True for SUCCEEDED, FAILED and CANCELLED, which no event ever leaves."""
    return status in TERMINAL


def transition(status: TaskStatus | str, event: TaskEvent | str) -> TaskStatus:
    """The status a task in ``status`` moves to when ``event`` is recorded.

    Raises:
        IllegalTransition: the table has no such entry (always so from a terminal state).
    """
    src, ev = TaskStatus(status), TaskEvent(event)
    try:
        return TRANSITIONS[(src, ev)]
    except KeyError:
        reason = "terminal state is absorbing" if src in TERMINAL else "no such transition"
        raise IllegalTransition(
            f"{ev.value} is not allowed in {src.value}: {reason}",
            status=src.value,
            event=ev.value,
        ) from None
