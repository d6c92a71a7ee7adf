"""The root of every Ratchet error and the stable wire codes (protocol/errors.py lists every
error class)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = ["ErrorCode", "RatchetError"]


class ErrorCode(StrEnum):
    """Stable error codes; part of the wire protocol, never renamed."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    CONFLICT = "CONFLICT"
    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    LOOP_DETECTED = "LOOP_DETECTED"
    FENCED = "FENCED"
    INVALID_DEFINITION = "INVALID_DEFINITION"
    INVALID_STATE_VALUE = "INVALID_STATE_VALUE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    # A task's outcome and the wait for it, as a client raises them (never in a reply).
    TASK_FAILED = "TASK_FAILED"
    TASK_CANCELLED = "TASK_CANCELLED"
    TASK_HANDED_OFF = "TASK_HANDED_OFF"
    TIMEOUT = "TIMEOUT"
    APPROVAL_REJECTED = "APPROVAL_REJECTED"
    RATE_LIMITED = "RATE_LIMITED"
    # A node's refused start (StartRefused): never in a reply (docs/operations.md).
    NODE_ID_IN_USE = "NODE_ID_IN_USE"
    PARTITION_COUNT_MISMATCH = "PARTITION_COUNT_MISMATCH"
    STORE_READ_ONLY = "STORE_READ_ONLY"
    NATS_UNREACHABLE = "NATS_UNREACHABLE"
    NATS_PORT_TAKEN = "NATS_PORT_TAKEN"
    SCHEMA_VERSION_MISMATCH = "SCHEMA_VERSION_MISMATCH"
    STORE_UNREACHABLE = "STORE_UNREACHABLE"
    AUDIT_KEY_MISMATCH = "AUDIT_KEY_MISMATCH"


class RatchetError(Exception):
    """Root of every Ratchet error.

    Args:
        message: what went wrong, for a human.
        retryable: whether repeating the same request may succeed.
        details: structured attributes (task_id, actor, field, ...).
    """

    code: ErrorCode = ErrorCode.INTERNAL
    default_retryable: bool = False
    #: An actor that raises it ends as if it had stopped: its supervisor neither restarts
    #: it nor counts a crash (e.g. FENCED: the task is not this node's to run any more).
    ends_actor: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = self.default_retryable if retryable is None else retryable
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        """The error as the ``error`` member of a reply."""
        return {
            "code": self.code.value,
            "message": self.message,
            "retryable": self.retryable,
            "details": {k: _wire_safe(v) for k, v in self.details.items()},
        }


def _wire_safe(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_wire_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _wire_safe(v) for k, v in value.items()}
    return str(value)
