"""How a tool call failed: the classes tool code raises (listed with every other error in
protocol/errors.py)."""

from __future__ import annotations

from typing import Any

from ratchet.protocol.error_codes import ErrorCode, RatchetError

__all__ = ["ToolCircuitOpen", "ToolConflict", "ToolDeadlineExceeded", "ToolError",
           "ToolInvalidArgument", "ToolOutcomeUnknown", "ToolPermissionDenied",
           "ToolRateLimited", "ToolTransient", "ToolWorkerGone"]


# -- outcomes of external calls (tools) ---------------------------------------------------
#
# Tool code raises these to say how a call failed; the runtime's retry policy is a table
# over them (see actors/tools.classify). Anything else a tool raises counts as transient
# for a read and as an unknown outcome for a write (it may have left before the raise).


class ToolError(RatchetError):
    """Root of the errors a tool call can end in."""


class ToolInvalidArgument(ToolError):
    """The provider rejected the request as malformed. Never retried."""

    code = ErrorCode.INVALID_ARGUMENT


class ToolPermissionDenied(ToolError):
    """The provider refused: not allowed. Never retried."""

    code = ErrorCode.PERMISSION_DENIED


class ToolConflict(ToolError):
    """The provider reports a conflict (e.g. the key was used for another request).
    Never retried."""

    code = ErrorCode.CONFLICT


class ToolRateLimited(ToolError):
    """Too many requests; retry after ``retry_after`` seconds (the provider's Retry-After)."""

    code = ErrorCode.UNAVAILABLE
    default_retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, **details: Any) -> None:
        super().__init__(message, retry_after=retry_after, **details)
        self.retry_after = retry_after


class ToolCircuitOpen(ToolError):
    """The provider's circuit breaker is open (actors/effects/breakers.py): the call was not
    made. Retryable after ``retry_after`` seconds (when the breaker lets a probe through)."""

    code = ErrorCode.CIRCUIT_OPEN
    default_retryable = True

    def __init__(self, message: str, *, retry_after: float, **details: Any) -> None:
        super().__init__(message, retry_after=round(retry_after, 3), **details)
        self.retry_after = retry_after


class ToolTransient(ToolError):
    """A failure known not to have taken effect (5xx before processing, connection refused).
    Retried with exponential backoff and full jitter."""

    code = ErrorCode.UNAVAILABLE
    default_retryable = True


class ToolWorkerGone(ToolTransient):
    """The tool worker a session is pinned to is gone (NATS knows nobody listening on its
    ping subject), so the request was not sent. Retried: the session's next request goes
    to any worker, which takes the session from its stored state."""


class ToolOutcomeUnknown(ToolError):
    """The call may or may not have taken effect (timeout, connection dropped after the
    request was sent). For a write this makes the action UNKNOWN: reconcile, never resend
    blindly."""

    code = ErrorCode.UNAVAILABLE


class ToolDeadlineExceeded(ToolError):
    """The remaining deadline (task → step → tool) ran out before a call could start.
    Nothing was sent; never retried."""

    code = ErrorCode.UNAVAILABLE
