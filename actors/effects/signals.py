"""The control signals of the action protocol: how a call tells its task that it cannot go
on now (a human must decide, a provider will confirm later, an operator paused it).

They are not errors (so not in protocol/errors.py) and derive from ``BaseException``: step
code's ``except Exception`` cannot swallow them. ``actors/effects/actions.py`` raises them
and re-exports them; the task actor catches them at its step boundary.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AwaitExternal", "HandoffRequired", "PauseRequested", "TaskSuspended"]


class TaskSuspended(BaseException):
    """Control signal, not an error (so not in protocol/errors.py): the task cannot go on
    now. A BaseException so that step code's ``except Exception`` cannot swallow it."""


class HandoffRequired(TaskSuspended):
    """A human must decide. ``approval`` is False for an undecidable outcome (the task goes
    UNKNOWN) and True for a decision the runtime cannot take (WAITING_APPROVAL), such as a
    compensation that failed for good."""

    def __init__(self, reason: str, package: dict[str, Any], *, approval: bool = False,
                 change: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.package = package
        self.approval = approval
        #: More of the commit that parks the task (``TaskChange`` fields; ``events`` come
        #: first): a gated call's pending approval and its ``approval.requested``.
        self.change: dict[str, Any] = change or {}


class AwaitExternal(TaskSuspended):
    def __init__(self, correlation_id: str, key: str, timeout: float) -> None:
        super().__init__(correlation_id)
        self.correlation_id = correlation_id
        self.key = key
        self.timeout = timeout


class PauseRequested(TaskSuspended):
    """An operator's pause, taken at the safe point before a tool call."""

    def __init__(self, tool: str) -> None:
        super().__init__(tool)
        self.tool = tool
