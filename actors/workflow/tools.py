"""Tool definitions: how a workflow reaches the outside world.

A tool declares its argument and result models (pydantic), its kind (``read`` or
``write``), for a write the idempotency key of the business action it performs (the same
logical action gives the same key across retries, restarts and replays), a timeout, a retry
policy, and optionally ``query`` (look the outcome up by key, to reconcile an unknown one)
and ``compensate`` (the idempotent action that undoes it, for sagas).

A write also has a **risk tier** (``risk``): ``write`` (the default) or ``irreversible``
(every call is parked for a human's approval first), and may ask approval for every call
(``requires_approval``) or for calls whose ``amount`` (a field of its arguments, or a
function of them) is above ``max_amount``. The gateway that parks such calls is
``actors/effects/risk.py``.

In a **sandbox fork** (``admin fork --sandbox``) a tool answers as its ``sandbox``
declaration says (actors/effects/sandbox.py): a stub callable (same signature as the tool's
code), ``"recorded"`` (a write: the original task's ledger answers), ``"blocked"``, or
``"live"`` (a read only). Undeclared, a read runs live and a write is blocked.

Tool code is either ``async def`` (runs on the event loop) or a plain ``def`` (blocking:
runs on the tool session's pykka thread). It reports failures by raising the
``protocol.errors.Tool*`` classes; :func:`classify` is the policy table over them.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from ratchet.protocol.errors import (
    ToolCircuitOpen,
    ToolConflict,
    ToolDeadlineExceeded,
    ToolDefinitionError,
    ToolInvalidArgument,
    ToolPermissionDenied,
    ToolRateLimited,
    ToolTransient,
)
from ratchet.protocol.subjects import is_token

__all__ = [
    "Accepted",
    "BreakerPolicy",
    "Compensation",
    "Decision",
    "RetryPolicy",
    "Tool",
    "ToolContext",
    "classify",
    "tool",
]

A = TypeVar("A", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)
Kind = Literal["read", "write"]
Risk = Literal["read", "write", "irreversible"]
#: How a tool answers in a sandbox fork: a stub ``fn(ctx, args)``, or one of these words.
SandboxMode = Literal["recorded", "blocked", "live"]
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True, slots=True)
class Accepted:
    """Returned by tool code (or ``query``) when the provider accepted the request but has not
    finished it (HTTP 202). The task waits (WAITING_EXTERNAL) for a confirmation message
    carrying ``correlation_id`` (default: the action's idempotency key), or reconciles by
    ``query`` when ``timeout`` passes."""

    provider_id: str | None = None
    correlation_id: str | None = None
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries: at most ``max_attempts`` calls, delays from ``base_delay`` doubling
    up to ``max_delay`` (full jitter), never past the remaining deadline."""

    max_attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ToolDefinitionError(f"invalid retry policy {self}")


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """A circuit breaker for a tool (actors/effects/breakers.py): it opens after ``failures``
    transient failures within ``window`` seconds and lets a probe through after ``cooldown``.
    Tools with the same ``group`` (a provider's name) share one breaker per tenant; the
    default group is the tool's name."""

    failures: int = 5
    window: float = 30.0
    cooldown: float = 30.0
    group: str | None = None

    def __post_init__(self) -> None:
        if self.failures < 1 or self.window <= 0 or self.cooldown <= 0:
            raise ToolDefinitionError(f"invalid breaker policy {self}")


class Decision(StrEnum):
    FAIL = "fail"  # never retried: invalid argument, permission, conflict
    RETRY_AFTER = "retry_after"  # rate limited: wait what the provider said
    BACKOFF = "backoff"  # transient: exponential backoff with full jitter
    UNKNOWN = "unknown"  # may have taken effect: reconcile, never resend blindly


_NEVER_RETRIED = (ToolInvalidArgument, ToolPermissionDenied, ToolConflict, ToolDeadlineExceeded)


def classify(exc: BaseException, kind: Kind) -> Decision:
    """The retry decision for a failed call. An exception the tool did not classify is
    treated as transient for a read and as an unknown outcome for a write (it may have been
    raised after the request left)."""
    if isinstance(exc, _NEVER_RETRIED):
        return Decision.FAIL
    if isinstance(exc, (ToolRateLimited, ToolCircuitOpen)):
        return Decision.RETRY_AFTER
    if isinstance(exc, ToolTransient):
        return Decision.BACKOFF
    # ToolOutcomeUnknown, a timeout, or anything unclassified.
    return Decision.UNKNOWN if kind == "write" else Decision.BACKOFF


@dataclass(slots=True)
class ToolContext:
    """What tool code sees. ``session`` is the tool session's state (tokens, cursors): change
    it in place and it is checkpointed after the call. ``live``: a remote tool's session's
    live resources (a browser), kept by the worker holding the session and never stored:
    rebuild them from ``session`` when empty (actors/effects/pinned_sessions.py)."""

    task_id: str
    tenant: str
    tool: str
    key: str | None
    attempt: int
    session: dict[str, Any]
    resources: Mapping[str, Any]
    live: dict[str, Any] = field(default_factory=dict)


ToolFn = Callable[[ToolContext, Any], Any]


@dataclass(frozen=True)
class Compensation:
    """Undo of a write: run ``tool`` with ``args(original_args, original_result)``."""

    tool: Tool[Any, Any]
    args: Callable[[Any, Any], BaseModel]


@dataclass(frozen=True)
class Tool(Generic[A, R]):
    name: str
    fn: ToolFn
    kind: Kind
    args: type[A]
    result: type[R]
    key: Callable[[A], str] | None = None
    timeout: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    query: Callable[[ToolContext, A], Any] | None = None
    compensate: Compensation | None = None
    session: str = "default"
    breaker: BreakerPolicy | None = None  # None: no circuit breaker for this tool
    #: The risk tier: ``read``, ``write`` or ``irreversible`` (None: the tool's kind).
    risk: Risk | None = None
    #: Every call waits for a human's approval before it is made.
    requires_approval: bool = False
    #: A call whose amount is above this waits for approval (needs ``amount``).
    max_amount: float | None = None
    #: Where a call's amount is: a field of ``args`` (by name) or a function of the args.
    amount: str | Callable[[A], float] | None = None
    #: How it answers in a sandbox fork (None: a read live, a write blocked).
    sandbox: SandboxMode | ToolFn | None = None
    #: Served by tool workers over JetStream, not by ``fn`` in this process
    #: (actors/workflow/remote_tools.py: ``remote_tool``).
    remote: bool = False

    @property
    def provider(self) -> str:
        """What its circuit breaker is keyed by (with the tenant)."""
        return (self.breaker.group if self.breaker and self.breaker.group else None) or self.name

    def __post_init__(self) -> None:
        where = f"tool {self.name!r}"
        if not _NAME.match(self.name) or not _NAME.match(self.session):
            raise ToolDefinitionError(f"{where}: name and session must match {_NAME.pattern}")
        if self.kind not in ("read", "write"):
            raise ToolDefinitionError(f"{where}: kind must be 'read' or 'write'")
        for label, model in (("args", self.args), ("result", self.result)):
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise ToolDefinitionError(f"{where}: {label} must be a pydantic model class")
        if self.kind == "write" and self.key is None:
            raise ToolDefinitionError(
                f"{where}: a write needs key=, the idempotency key of its business action")
        if self.timeout <= 0:
            raise ToolDefinitionError(f"{where}: timeout must be > 0")
        if self.remote and not is_token(self.name):
            raise ToolDefinitionError(  # it is one token of its requests' subject
                f"{where}: a remote tool's name must match [A-Za-z0-9_-]{{1,64}}")
        if self.compensate is not None and self.kind != "write":
            raise ToolDefinitionError(f"{where}: only a write can declare a compensation")
        self._check_risk(where)
        self._check_sandbox(where)

    @property
    def tier(self) -> Risk:
        """The risk tier the gateway applies (``risk``, else the kind)."""
        return self.risk or self.kind

    def _check_risk(self, where: str) -> None:
        if self.risk not in (None, "read", "write", "irreversible"):
            raise ToolDefinitionError(f"{where}: risk must be 'read', 'write' or 'irreversible'")
        gated = self.requires_approval or self.max_amount is not None
        if self.kind == "read" and (self.tier != "read" or gated):
            # A read has no idempotency key: an approval could not make it exactly once.
            raise ToolDefinitionError(f"{where}: a read cannot be gated; declare a write")
        if self.kind == "write" and self.tier == "read":
            raise ToolDefinitionError(f"{where}: a write's risk is 'write' or 'irreversible'")
        if self.max_amount is not None and (self.amount is None or self.max_amount < 0):
            raise ToolDefinitionError(f"{where}: max_amount needs amount= and must be >= 0")
        if isinstance(self.amount, str) and self.amount not in self.args.model_fields:
            raise ToolDefinitionError(
                f"{where}: amount {self.amount!r} is not a field of {self.args.__name__}")


    def _check_sandbox(self, where: str) -> None:
        mode = self.sandbox
        if mode is None or (callable(mode) and not isinstance(mode, str)):
            return
        if mode not in ("recorded", "blocked", "live"):
            raise ToolDefinitionError(
                f"{where}: sandbox must be a stub callable, 'recorded', 'blocked' or 'live'")
        if mode == "live" and self.kind == "write":
            # A sandbox fork must have no effect at a provider: a write is never sent.
            raise ToolDefinitionError(f"{where}: a write cannot run live in a sandbox")
        if mode == "recorded" and self.kind == "read":
            raise ToolDefinitionError(
                f"{where}: only a write is recorded (in the ledger); a read is 'live' or a stub")


def tool(
    *,
    kind: Kind,
    args: type[A],
    result: type[R],
    key: Callable[[A], str] | None = None,
    timeout: float = 10.0,
    retry: RetryPolicy | None = None,
    query: Callable[[ToolContext, A], R | Accepted | Awaitable[R | Accepted | None] | None]
    | None = None,
    compensate: Compensation | None = None,
    session: str = "default",
    name: str | None = None,
    breaker: BreakerPolicy | None = None,
    risk: Risk | None = None,
    requires_approval: bool = False,
    max_amount: float | None = None,
    amount: str | Callable[[A], float] | None = None,
    sandbox: SandboxMode | ToolFn | None = None,
) -> Callable[[Callable[[ToolContext, A], Any]], Tool[A, R]]:
    """Decorator making a :class:`Tool` of a function ``fn(ctx, args) -> result``."""

    def make(fn: Callable[[ToolContext, A], Any]) -> Tool[A, R]:
        return Tool(name or fn.__name__, fn, kind, args, result, key, timeout,
                    retry or RetryPolicy(), query, compensate, session, breaker, risk,
                    requires_approval, max_amount, amount, sandbox)

    return make
