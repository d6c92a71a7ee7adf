"""One error root for the whole runtime, with stable wire codes.

Every error that can cross a process boundary carries a ``code`` from :class:`ErrorCode`,
a human message, a ``retryable`` flag and structured ``details``; the same shape travels in
error replies (see ``docs/protocol.md``).

Every error class of the runtime is listed here, whichever layer raises it, so one module
lists them all with their codes: the root and the codes are defined in
protocol/error_codes.py, the outcomes of tool calls in protocol/tool_errors.py (both
imported from here), the rest below — but for a task's outcome as a client awaiting it
raises it (``protocol/task_outcomes.py``: failed, cancelled, handed off, timed out).
Control signals that are not errors (a task suspending, a request forwarded to another
node) stay beside the code that raises and catches them.
"""

from __future__ import annotations

from typing import Any

from ratchet.protocol.error_codes import ErrorCode, RatchetError
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
    ToolWorkerGone,
)

__all__ = [
    "ErrorCode", "RatchetError", "InvalidMessage", "IllegalTransition", "RequestConflict",
    "InvalidSchedule", "VersionConflict", "BudgetExhausted", "NotFound", "UnknownWorkflow", "Unavailable",
    "StoreUnavailable", "StoreFileLost", "ToolError", "ToolInvalidArgument",
    "ToolPermissionDenied", "ToolConflict", "ToolRateLimited", "ToolTransient", "ToolCircuitOpen",
    "ToolOutcomeUnknown", "ToolDeadlineExceeded", "ToolWorkerGone", "WorkflowDefinitionError",
    "ToolDefinitionError", "DuplicateMessage", "ActionKeyTaken", "Fenced",
    "PartitionCountMismatch", "ActorCrashed", "ActorStopped", "AskTimeout", "ActionFailed",
    "SandboxBlocked", "LoopDetected", "RemoteError", "Escalation", "NotOwner", "TaskFinished",
    "PermissionDenied", "Unauthenticated", "CommandConflict", "InvalidStateValue",
    "HandlingFailed", "SecretUnreadable", "StartRefused", "TooManyItems", "UsageError",
    "NatsUnreachable",
    "RateLimited", "MigrationRefused", "BranchSettled",
]


class InvalidMessage(RatchetError):
    """An inbound message could not be decoded or failed validation."""

    code = ErrorCode.INVALID_ARGUMENT


class InvalidSchedule(InvalidMessage):
    """A schedule that cannot be: a bad cron expression, time zone, interval or policy."""


class InvalidStateValue(RatchetError):
    """A step returned a state value that cannot be checkpointed: not plain data msgpack
    can encode, or larger than the node's per-value or per-checkpoint limit. Running the
    step again would return it again: the step fails for good."""

    code = ErrorCode.INVALID_STATE_VALUE


class TooManyItems(RatchetError):
    """A map node's ``items(state)`` returned more items than its ``max_items``: refused
    before any item runs (running it again would return them again)."""

    code = ErrorCode.INVALID_ARGUMENT


class SecretUnreadable(RatchetError):
    """A sealed secret cannot be read or written: no secret key, or not the key it was
    sealed under (protocol/secrets.py). Restarting cannot help; fixing the key does."""

    code = ErrorCode.UNAVAILABLE


class HandlingFailed(RatchetError):
    """An inbound message whose handling raised an unexpected (non-Ratchet) exception on
    every one of its deliveries, up to the bound: dead-lettered with the exception, never
    redelivered for ever."""


class UnknownWorkflow(RatchetError):
    """A request names a workflow (or version) this node does not have."""

    code = ErrorCode.INVALID_ARGUMENT


class MigrationRefused(RatchetError):
    """``admin migrate``: the target version declares no migration from the task's, or the
    migration raised or returned what the task cannot go on with (an unknown node, a
    parked task moved off the node it waits at, a state that is not a map). Nothing was
    changed (actors/workflow/migrations.py)."""

    code = ErrorCode.INVALID_ARGUMENT


class IllegalTransition(RatchetError):
    """A task status change that the transition table does not allow."""

    code = ErrorCode.ILLEGAL_TRANSITION


class RequestConflict(RatchetError):
    """The same idempotency key was used with a different request body."""

    code = ErrorCode.CONFLICT


class BudgetExhausted(RatchetError):
    """A task's budget (tokens, model calls, tool calls, wall time, money) is spent."""

    code = ErrorCode.BUDGET_EXHAUSTED


class VersionConflict(RatchetError):
    """Compare-and-set on a task's ``version`` failed: someone else moved it first."""

    code = ErrorCode.CONFLICT
    default_retryable = True


class Unauthenticated(RatchetError):
    """A request that must be signed (docs/security.md) is not, or its signature, key,
    time or replay check failed. Nothing was done."""

    code = ErrorCode.UNAUTHENTICATED


class NotFound(RatchetError):
    """The named task does not exist (for this tenant)."""

    code = ErrorCode.NOT_FOUND


class Unavailable(RatchetError):
    """A dependency (NATS, the store) cannot serve right now."""

    code = ErrorCode.UNAVAILABLE
    default_retryable = True


class NatsUnreachable(Unavailable):
    """A client found no NATS server at the URL within its connect timeout. The message is
    the one line a user sees; the URL in it has its credentials redacted."""


class RateLimited(RatchetError):
    """A tenant submits faster than its rate limit (supervisors/services/rate_limits.py):
    not accepted; retryable after ``retry_after`` seconds."""

    code = ErrorCode.RATE_LIMITED
    default_retryable = True

    def __init__(self, message: str, *, retry_after: float, **details: Any) -> None:
        super().__init__(message, retry_after=round(retry_after, 3), **details)
        self.retry_after = retry_after


class StoreUnavailable(Unavailable):
    """The store could not write (its disk is full, an I/O error): nothing of the
    transaction was committed. Retry later; the node goes on once the store writes again."""


class StoreFileLost(Unavailable):
    """The database file this node opened is no longer at its path (deleted or replaced):
    the node refuses every write from then on and stops (persistence/file_watch.py)."""


# -- definitions (raised when a workflow or tool is built, never halfway through a run) ----
#
# Also ValueErrors: callers that validate with ``except ValueError`` keep working.


class WorkflowDefinitionError(RatchetError, ValueError):
    """A workflow definition is malformed; the message names the bad node."""

    code = ErrorCode.INVALID_DEFINITION


class ToolDefinitionError(RatchetError, ValueError):
    """A tool definition is malformed; the message names the tool and the bad part."""

    code = ErrorCode.INVALID_DEFINITION


# -- the store ----------------------------------------------------------------------------


class DuplicateMessage(RatchetError):
    """The inbound message id was already processed; the change was not applied.

    The task actor that delivered the message answers ``duplicate``: it never reaches a
    reply or an event."""

    code = ErrorCode.CONFLICT

    def __init__(self, message_id: str) -> None:
        super().__init__(message_id, message_id=message_id)
        self.message_id = message_id


class ActionKeyTaken(RatchetError):
    """The idempotency key is already in the ledger; the change was not applied.

    ``existing`` holds the row's columns (see ``persistence.ledger.action_record``) so the
    caller can act on it without another read. The action runner resumes from that row: it
    never reaches a reply or an event."""

    code = ErrorCode.CONFLICT

    def __init__(self, key: str, existing: tuple[Any, ...] | None = None) -> None:
        super().__init__(key, key=key)
        self.key = key
        self.existing = existing


class Fenced(RatchetError):
    """The write came from a node that no longer holds the task's partition lease.

    The actor that hit it stops without a crash: restarting it here cannot help. Whoever
    holds the lease runs the task (this node again, once a late renewal goes through)."""

    code = ErrorCode.FENCED
    ends_actor = True


class StartRefused(RatchetError):
    """A node cannot start as configured; retrying cannot help. Its ``code`` says why:
    NODE_ID_IN_USE (``serve`` twice on one state dir), STORE_READ_ONLY, NATS_UNREACHABLE,
    NATS_PORT_TAKEN, PARTITION_COUNT_MISMATCH (a class of its own, below)."""

    def __init__(self, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code


class PartitionCountMismatch(StartRefused):
    """The store was created for another number of partitions than this node uses."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(ErrorCode.PARTITION_COUNT_MISMATCH, message, **details)


# -- actors -------------------------------------------------------------------------------


class ActorCrashed(RatchetError):
    """The actor raised while handling the asked message (the cause is chained).

    Retryable: its supervisor restarts it from the last checkpoint, and a repeated message
    is then handled by the fresh actor."""

    default_retryable = True


class ActorStopped(Unavailable):
    """The actor stopped before it answered."""


class AskTimeout(Unavailable):
    """No answer within the ask's timeout; the message may still be processed."""


class ActionFailed(RatchetError):
    """The action failed for good (never-retried error, retries or deadline exhausted, or
    a key conflict). The step fails; the task compensates and ends FAILED — unless the
    step declares ``on_exhausted="human"`` and the failure is :attr:`exhausted`."""

    code = ErrorCode.CONFLICT
    #: The provider's errors were retryable and the tool's retries (or its deadline) ran
    #: out: another try later may succeed, so a human may be asked (actors/task/exhausted.py).
    exhausted = False


class SandboxBlocked(ActionFailed):
    """A sandbox fork refused a call it may not make: a write with no ``sandbox=``
    declaration, a ``recorded`` one the original never made, or a ``blocked`` tool. Like
    any ActionFailed the step fails for good: the fork ends FAILED with this reason."""

    code = ErrorCode.PERMISSION_DENIED


class LoopDetected(RatchetError):
    """An agent node's loop was detected again after its corrective message."""

    code = ErrorCode.LOOP_DETECTED


class UsageError(RatchetError):
    """A ``ratchet`` command line that cannot run as given: an option value that does not
    parse, an ``--app`` that does not import, no NATS to talk to. Its message says what is
    wrong and what to do; the command prints it on one line and exits 2 (docs/cli.md)."""

    code = ErrorCode.INVALID_ARGUMENT


class RemoteError(RatchetError):
    """An error reply from a node; ``code`` is the wire code (INTERNAL if this client does
    not know it, the original in ``wire_code``)."""

    def __init__(self, code: str, message: str, retryable: bool, details: dict[str, Any]):
        super().__init__(message, retryable=retryable, **details)
        try:
            self.code = ErrorCode(code)
        except ValueError:
            self.code = ErrorCode.INTERNAL
        self.wire_code = code


# -- supervision and the node's services --------------------------------------------------


class Escalation(RatchetError):
    """A supervisor's restart intensity was exceeded; its parent must act."""


class NotOwner(RatchetError):
    """This node does not hold the lease of the task's partition (another node runs it)."""

    code = ErrorCode.UNAVAILABLE
    default_retryable = True


class TaskFinished(RatchetError):
    """Mail for a task that already reached a terminal state: nothing to deliver."""

    code = ErrorCode.CONFLICT


class BranchSettled(RatchetError):
    """A branch's step commit found its row settled meanwhile (its timeout fired, its join
    decided): the commit is rolled back and the branch stops where it is."""

    code = ErrorCode.CONFLICT


class PermissionDenied(RatchetError):
    """An admin principal lacks the role the verb needs, or the verb is not one of the
    subject's tenant (a cluster verb on a tenant's subject)."""

    code = ErrorCode.PERMISSION_DENIED


class CommandConflict(RatchetError):
    """An admin command id reused with another request, or an ``expected_version`` or
    ``request_hash`` that does not match the task."""

    code = ErrorCode.CONFLICT
