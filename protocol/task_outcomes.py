"""A task's outcome as a client awaiting it sees it: the task's output, or the typed error
of how it ended — failed (a budget exhausted among the failures), cancelled, or handed to
a human — and the pure rules that read that outcome from the events of the task's life or
from its snapshot (``actors/transport/handles.py`` applies them to a live subscription).

These errors never travel in a node's reply: the client raises them from an event or a
snapshot. Their codes are ``ErrorCode``s all the same, so one ``except RatchetError``
and one ``code`` switch cover every error a client sees.
"""

from __future__ import annotations

from typing import Any

from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import ErrorCode, RatchetError
from ratchet.protocol.messages import Event, TaskSnapshot
from ratchet.protocol.states import TaskStatus

__all__ = [
    "HANDOFF_EVENTS", "PARKED_STATUSES", "TERMINAL_EVENTS", "Outcome", "OutcomeReader", "ResultTimeout",
    "TaskBudgetExhausted", "TaskCancelled", "TaskError", "TaskFailed", "TaskHandedOff",
    "outcome_of_event", "outcome_of_snapshot",
]

#: The events that end a task: nothing follows them.
TERMINAL_EVENTS = frozenset({EventType.TASK_SUCCEEDED, EventType.TASK_FAILED,
                             EventType.TASK_CANCELLED})
#: The events that park a task until a human acts (UNKNOWN, or WAITING_APPROVAL with a
#: handoff package): an outcome for whoever awaits the result, though not terminal.
HANDOFF_EVENTS = frozenset({EventType.TASK_UNKNOWN, EventType.TASK_HANDOFF})
_HANDOFF_STATUS = {EventType.TASK_UNKNOWN: TaskStatus.UNKNOWN.value,
                   EventType.TASK_HANDOFF: TaskStatus.WAITING_APPROVAL.value}
#: The statuses a task handed to a human is in until someone acts.
PARKED_STATUSES = frozenset(_HANDOFF_STATUS.values())
#: How much of a failure's message goes into the one-line message (all of it is in
#: ``error``).
_MESSAGE_CHARS = 200


class TaskError(RatchetError):
    """Root of a task's unsuccessful outcomes; ``task_id`` names the task."""

    def __init__(self, message: str, *, task_id: str, retryable: bool | None = None,
                 **details: Any) -> None:
        super().__init__(message, retryable=retryable, task_id=task_id, **details)
        self.task_id = task_id


class TaskFailed(TaskError):
    """The task ended FAILED (after its saga, if it had something to undo).

    ``reason`` says why (``step s1 failed 3 times``, ``budget exhausted``, …); ``error`` is
    the task's own error map (``code``, ``type``, ``message``), ``trace`` its traceback's
    tail."""

    code = ErrorCode.TASK_FAILED

    def __init__(self, task_id: str, reason: str, error: dict[str, Any] | None) -> None:
        error = dict(error or {})
        self.trace: str | None = error.pop("trace", None)
        cause = f"{error.get('type')}: {error.get('message')}" if error.get("message") else ""
        cause = " ".join(cause.split())[:_MESSAGE_CHARS]
        super().__init__(f"task {task_id} failed: {reason}" + (f" ({cause})" if cause else ""),
                         task_id=task_id, reason=reason, error=error)
        self.reason = reason
        self.error = error

    @property
    def cause_code(self) -> str:
        """The code of what made the task fail (``INTERNAL`` for a step's exception)."""
        return str(self.error.get("code") or ErrorCode.INTERNAL.value)


class TaskBudgetExhausted(TaskFailed):
    """The task failed because a budget was spent: a write refused by its ``tool_calls``
    budget, or an agent node out of budget or turns (docs/agents.md)."""

    code = ErrorCode.BUDGET_EXHAUSTED


class TaskCancelled(TaskError):
    """The task ended CANCELLED: an operator's cancel, or an approval timed out with
    ``on_timeout="cancel"``."""

    code = ErrorCode.TASK_CANCELLED

    def __init__(self, task_id: str, by: str | None = None, reason: str | None = None) -> None:
        text = f"task {task_id} was cancelled" + (f" by {by}" if by else "")
        super().__init__(text + (f": {reason}" if reason else ""), task_id=task_id, by=by,
                         reason=reason)
        self.by = by
        self.reason = reason


class TaskHandedOff(TaskError):
    """The task waits for a human: a write of unknown outcome (UNKNOWN) or a handoff
    (WAITING_APPROVAL; ``ratchet admin handoff`` shows the package). Not terminal: once a
    human resolved it, awaiting the result again may return the output (retryable).
    ``version``: the task's version at the handoff (None when read from a snapshot)."""

    code = ErrorCode.TASK_HANDED_OFF
    default_retryable = True

    def __init__(self, task_id: str, status: str, reason: str | None = None,
                 version: int | None = None) -> None:
        super().__init__(f"task {task_id} waits for a human ({status})"
                         + (f": {reason}" if reason else ""),
                         task_id=task_id, status=status, reason=reason)
        self.status = status
        self.reason = reason
        self.version = version

    def superseded_by(self, snapshot: TaskSnapshot) -> bool:
        """Whether ``snapshot``, taken after the handoff, shows the task moved on since."""
        return self.version is not None and snapshot.version >= self.version \
            and snapshot.status not in PARKED_STATUSES


class ResultTimeout(RatchetError, TimeoutError):
    """A client stopped waiting for tasks' outcomes; the tasks go on. Also a
    ``TimeoutError``. ``pending``: the task ids still without an outcome."""

    code = ErrorCode.TIMEOUT
    default_retryable = True

    def __init__(self, timeout: float, pending: list[str], hint: str = "") -> None:
        shown = ", ".join(pending[:5]) + (", …" if len(pending) > 5 else "")
        super().__init__(f"no outcome within {timeout:g} s for {len(pending)} task(s): {shown}"
                         + hint, pending=pending[:100], timeout=timeout)
        self.pending = pending


#: The task's output (``task.succeeded``'s ``output``), or how it did not succeed.
Outcome = dict[str, Any] | TaskError


def _failed(task_id: str, reason: str | None, error: dict[str, Any] | None) -> TaskFailed:
    why = reason or (error or {}).get("reason") or "failed"
    if (error or {}).get("code") == ErrorCode.BUDGET_EXHAUSTED.value:
        return TaskBudgetExhausted(task_id, why, error)
    return TaskFailed(task_id, why, error)


def outcome_of_event(event: Event) -> Outcome | None:
    """The outcome an event of a task's life carries, None for any other event."""
    payload = event.payload
    if event.type == EventType.TASK_SUCCEEDED:
        output = payload.get("output")
        return output if isinstance(output, dict) else {}
    if event.type == EventType.TASK_FAILED:
        error = payload.get("error")
        return _failed(event.task_id, payload.get("reason"),
                       error if isinstance(error, dict) else None)
    if event.type == EventType.TASK_CANCELLED:
        return TaskCancelled(event.task_id, payload.get("by"), payload.get("reason"))
    if event.type in HANDOFF_EVENTS:
        return TaskHandedOff(event.task_id, _HANDOFF_STATUS[EventType(event.type)],
                             payload.get("reason"), event.aggregate_version)
    return None


def outcome_of_snapshot(snapshot: TaskSnapshot) -> Outcome | None:
    """The outcome a task's snapshot shows: its terminal status, or UNKNOWN; None while it
    runs or waits. (A WAITING_APPROVAL snapshot does not tell a handoff from an approval
    node: only the ``task.handoff`` event does.)"""
    status = snapshot.status
    if status == TaskStatus.SUCCEEDED.value:
        return dict(snapshot.output or {})
    if status == TaskStatus.FAILED.value:
        return _failed(snapshot.task_id, None, snapshot.error)
    if status == TaskStatus.CANCELLED.value:
        return TaskCancelled(snapshot.task_id)
    if status == TaskStatus.UNKNOWN.value:
        return TaskHandedOff(snapshot.task_id, status)
    return None


class OutcomeReader:
    """Reads outcomes from the events of tasks' lives, in stream order.

    A terminal event is an outcome at once. A handoff is one only if nothing of the task's
    life follows it in the stream: when events are replayed, a later event means a human
    already moved the task on. So a handoff is held until the subscription has caught up
    (the stream has nothing more pending for it) and dropped if the task moves first.
    """

    def __init__(self) -> None:
        self._held: dict[str, TaskError] = {}

    def read(self, event: Event) -> list[tuple[str, Outcome]]:
        """The outcome ``event`` settles, as ``(task_id, outcome)``: none, or one."""
        outcome = outcome_of_event(event)
        if isinstance(outcome, TaskHandedOff):
            self._held[event.task_id] = outcome
            return []
        self._held.pop(event.task_id, None)
        return [] if outcome is None else [(event.task_id, outcome)]

    def caught_up(self) -> list[tuple[str, Outcome]]:
        """The handoffs held, now that no message is pending after the last one read."""
        held, self._held = self._held, {}
        return list(held.items())
