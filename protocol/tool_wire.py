"""Tools served by worker processes: the request and reply messages (docs/protocol.md,
"Serving a tool from another process or language").

A node calls a remote tool by publishing a :class:`ToolRequest` on the JetStream subject
``ratchet.tools.<tenant>.<tool>`` (stream ``RATCHET_TOOLS_<tenant>``, work queue), or
``ratchet.tools.<tenant>.<tool>.<worker>`` for a session pinned to that worker; a worker, in any
language, answers with a :class:`ToolReply` published (core NATS) on the request's
``reply_to``. Both are msgpack maps; a worker needs a NATS client and msgpack only.

The failure vocabulary of a reply (:data:`REPLY_CODES`) is finer than the error codes of
the rest of the protocol, because the node's retry policy depends on it: a failure known
not to have taken effect (``UNAVAILABLE``) is retried; one that may have taken effect
(``OUTCOME_UNKNOWN``, and any code a node does not know) makes a write UNKNOWN, which is
reconciled by the ``query`` op, never resent blindly.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretBytes, SecretStr

from ratchet.protocol.codec import decode_map
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import SCHEMA_VERSION
from ratchet.protocol.tool_errors import (
    ToolCircuitOpen,
    ToolConflict,
    ToolDeadlineExceeded,
    ToolError,
    ToolInvalidArgument,
    ToolOutcomeUnknown,
    ToolPermissionDenied,
    ToolRateLimited,
    ToolTransient,
)

__all__ = [
    "CORRELATION_HEADER",
    "DEADLINE_HEADER",
    "MAX_TOOL_MESSAGE_BYTES",
    "REPLY_CODES",
    "ToolAccepted",
    "ToolReply",
    "ToolReplyError",
    "ToolRequest",
    "decode_reply",
    "decode_request",
    "error_of_exception",
    "exception_of_error",
    "request_msg_id",
    "revealed",
]

#: Headers of a request (and of its reply): the call's correlation id, and its deadline
#: (epoch seconds, as text) for a worker that wants it before decoding the body.
CORRELATION_HEADER = "Ratchet-Correlation-Id"
DEADLINE_HEADER = "Ratchet-Deadline"

#: The largest request or reply either side accepts, in bytes (NATS's default max payload).
MAX_TOOL_MESSAGE_BYTES = 1024 * 1024

M = TypeVar("M", bound=BaseModel)
#: ``defer_build``: built at their first use, not as every node starts (a node without
#: remote tools never builds them; docs/operations.md, "Restart (W4)").
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)
_ID = Field(min_length=1, max_length=128)


class ToolRequest(BaseModel):
    """One call (``op="call"``) or one outcome lookup (``op="query"``) of a tool.

    ``args`` is the tool's argument model dumped (JSON-compatible values; secrets in
    clear: the worker needs them). ``idempotency_key`` is the ledger's key of the business
    action (None for a read): pass it on to the provider. ``deadline``: epoch seconds after
    which the node no longer waits (a worker should not start the call after it).

    The node's local worker gets its requests through an in-process loopback, not as bytes
    (actors/effects/local_tools.py): there ``args`` is the argument model itself, and a
    ``tool`` name may be any in-process tool's. What travels as bytes is checked against
    this model (actors/effects/remote_tool.py).
    """

    model_config = _STRICT

    schema_version: Literal[1] = SCHEMA_VERSION
    correlation_id: str = _ID
    task_id: str = _ID
    tenant: str = Field(min_length=1, max_length=64)
    tool: str = Field(min_length=1, max_length=64)
    op: Literal["call", "query"]
    args: dict[str, Any]
    idempotency_key: str | None = Field(default=None, max_length=512)
    attempt: int = Field(ge=1, le=1_000_000)
    deadline: float
    reply_to: str = Field(min_length=1, max_length=256)
    #: A tool with a session (``remote_tool(..., session=...)``): the session, one per
    #: (task, session name), and its state as the node last stored it — the truth, from
    #: which a worker that does not hold the session (a restart) builds it again.
    session_id: str | None = Field(default=None, max_length=200)
    session_state: dict[str, Any] | None = None


class ToolReplyError(BaseModel):
    """Why a call failed: ``code`` one of :data:`REPLY_CODES` (another code is read as
    ``OUTCOME_UNKNOWN``); ``retry_after`` (seconds) with ``RATE_LIMITED``."""

    model_config = _STRICT

    code: str = Field(min_length=1, max_length=64)
    message: str = Field(default="", max_length=4000)
    retryable: bool = False
    retry_after: float | None = Field(default=None, ge=0, le=86_400)


class ToolAccepted(BaseModel):
    """The provider accepted the request without finishing it (HTTP 202): the task waits
    for a confirmation carrying ``correlation_id`` (default: the idempotency key) on
    ``ratchet.external.<tenant>``, or queries again after ``timeout`` seconds."""

    model_config = _STRICT

    provider_id: str | None = Field(default=None, max_length=256)
    correlation_id: str | None = Field(default=None, max_length=128)
    timeout: float | None = Field(default=None, gt=0, le=30 * 86_400)


class ToolReply(BaseModel):
    """The answer to a :class:`ToolRequest`, echoing its ``correlation_id`` and
    ``idempotency_key`` (a reply settles only the call both match).

    ``ok`` with ``result``: the tool's result model dumped (for a query, None: not found);
    ``ok`` with ``accepted`` instead: the provider accepted the request without finishing it
    (``{provider_id, correlation_id, timeout}``: the task waits for a confirmation); not
    ``ok``: ``error``.
    """

    model_config = _STRICT

    schema_version: Literal[1] = SCHEMA_VERSION
    correlation_id: str = _ID
    idempotency_key: str | None = Field(default=None, max_length=512)
    ok: bool
    result: Any = None
    accepted: ToolAccepted | None = None
    error: ToolReplyError | None = None
    #: For a request with a session: its state after the call (the node stores it), and
    #: the worker holding it, whose pinned subject the session's next calls go to.
    session_state: dict[str, Any] | None = None
    worker: str | None = Field(default=None, max_length=64)


def request_msg_id(key: str | None, attempt: int, op: str, correlation_id: str) -> str:
    """The ``Nats-Msg-Id`` of a request.

    Not the bare idempotency key: JetStream drops a second message with the same id within
    its duplicate window (120 s), and the runner does re-send deliberately under the same
    key (a resend after a query found nothing is attempt n+1). A call's id is
    ``<key>:<attempt>:call``, so the same attempt published twice (a publisher retrying a
    publish whose ack it lost) is stored once. A query adds its correlation id: the runner
    numbers the queries of each reconciliation from 1 again, and a query is a read, safe to
    repeat. A read has no key: its correlation id is its message id.
    """
    if key is None:
        return f"read:{correlation_id}"
    if op == "call":
        return f"{key}:{attempt}:call"
    return f"{key}:{attempt}:{op}:{correlation_id}"


def revealed(value: Any) -> Any:
    """Dumped arguments or results with their secrets in clear: the other side needs them
    (the worker to call the provider, the node to keep the result sealed). They travel in
    the message only; a deployment that cares keeps NATS on TLS."""
    if isinstance(value, SecretStr | SecretBytes):
        secret = value.get_secret_value()
        return secret.decode() if isinstance(secret, bytes) else secret
    if isinstance(value, dict):
        return {k: revealed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [revealed(v) for v in value]
    return value


def decode_request(data: bytes) -> ToolRequest:
    """Raises InvalidMessage: not msgpack, too large, or not a valid request."""
    return _decode(ToolRequest, data, "tool request")


def decode_reply(data: bytes) -> ToolReply:
    """Raises InvalidMessage: not msgpack, too large, or not a valid reply."""
    return _decode(ToolReply, data, "tool reply")


def _decode(model: type[M], data: bytes, what: str) -> M:
    if len(data) > MAX_TOOL_MESSAGE_BYTES:
        raise InvalidMessage(f"{what} too large", size=len(data), limit=MAX_TOOL_MESSAGE_BYTES)
    raw = decode_map(data)
    try:
        return model.model_validate(raw)
    except Exception as exc:  # pydantic's ValidationError, or a RecursionError on junk
        raise InvalidMessage(f"{what} failed validation: {str(exc)[:300]}") from None


# -- failures, both ways ------------------------------------------------------------------

#: Reply code -> the exception the node's retry policy (actors/workflow/tools.classify)
#: sees. ``OUTCOME_UNKNOWN`` and unknown codes: ToolOutcomeUnknown.
REPLY_CODES: dict[str, type[ToolError]] = {
    "INVALID_ARGUMENT": ToolInvalidArgument,  # never retried
    "PERMISSION_DENIED": ToolPermissionDenied,  # never retried
    "CONFLICT": ToolConflict,  # never retried (the key was used for another request)
    "DEADLINE_EXCEEDED": ToolDeadlineExceeded,  # not started: nothing was sent
    "RATE_LIMITED": ToolRateLimited,  # retried after retry_after
    "UNAVAILABLE": ToolTransient,  # known not to have taken effect: retried with backoff
    "OUTCOME_UNKNOWN": ToolOutcomeUnknown,  # may have taken effect: reconciled by query
}

#: Exception class -> reply code, most specific first (a worker's side).
_CODE_OF: tuple[tuple[type[BaseException], str], ...] = (
    (ToolInvalidArgument, "INVALID_ARGUMENT"),
    (ToolPermissionDenied, "PERMISSION_DENIED"),
    (ToolConflict, "CONFLICT"),
    (ToolDeadlineExceeded, "DEADLINE_EXCEEDED"),
    (ToolRateLimited, "RATE_LIMITED"),
    (ToolCircuitOpen, "RATE_LIMITED"),
    (ToolTransient, "UNAVAILABLE"),
)


def error_of_exception(exc: BaseException) -> ToolReplyError:
    """What a worker replies for an exception its tool code raised; anything unclassified
    is ``OUTCOME_UNKNOWN`` (it may have been raised after the request left)."""
    code = next((c for cls, c in _CODE_OF if isinstance(exc, cls)), "OUTCOME_UNKNOWN")
    retry_after = getattr(exc, "retry_after", None)
    return ToolReplyError(
        code=code, message=f"{type(exc).__name__}: {exc}"[:4000],
        retryable=code in ("RATE_LIMITED", "UNAVAILABLE"),
        retry_after=float(retry_after) if isinstance(retry_after, int | float) else None)


def exception_of_error(error: ToolReplyError | None, tool: str) -> ToolError:
    """The exception a node's runner classifies for a failed reply."""
    if error is None:
        return ToolOutcomeUnknown(f"{tool}: a failed reply without an error", tool=tool)
    cls = REPLY_CODES.get(error.code, ToolOutcomeUnknown)
    message = f"{tool} (remote {error.code}): {error.message}"
    if cls is ToolRateLimited:
        return ToolRateLimited(message, retry_after=error.retry_after, tool=tool)
    return cls(message, tool=tool, remote_code=error.code)
