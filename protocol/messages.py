"""Wire models. Every message is a msgpack map validated by one of these models and
carries ``schema_version``, so any language with a NATS client and msgpack can speak it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SCHEMA_VERSION",
    "MIN_PRIORITY",
    "MAX_PRIORITY",
    "Envelope",
    "SubmitTask",
    "TaskAccepted",
    "GetTask",
    "TaskSnapshot",
    "Event",
    "ErrorBody",
    "Reply",
    "StartTask",
    "ApprovalDecision",
    "Budget",
    "Principal",
    "AdminCommand",
]

SCHEMA_VERSION: Literal[1] = 1

#: Strict: no coercion (a bin value is not a str, a str not an int; an int is a float).
#: ``defer_build``: each model's validator and serializer are built at its first use, not
#: at import — a restarted node resumes its tasks without building any of them (~20 ms of
#: its start, pydantic's schema machinery included; docs/operations.md, "Restart (W4)").
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)
_LENIENT = ConfigDict(frozen=True, defer_build=True)


class Envelope(BaseModel):
    """The frame around every command and actor mail message.

    ``message_id`` identifies this message (receivers drop repeats); ``correlation_id``
    ties a conversation together (a task's submission, its mail, its replies);
    ``causation_id`` names the message that caused this one; ``reply_to`` is where an
    answer goes, if one is wanted.
    """

    model_config = _STRICT

    schema_version: Literal[1] = SCHEMA_VERSION
    type: str = Field(min_length=1, max_length=64)
    message_id: str = Field(min_length=1, max_length=128)
    correlation_id: str = Field(min_length=1, max_length=128)
    causation_id: str | None = Field(default=None, max_length=128)
    reply_to: str | None = Field(default=None, max_length=256)
    sent_at: float | None = None
    body: dict[str, Any] = Field(default_factory=dict)


#: The range of a submission's ``priority`` (higher is served first within a tenant).
MIN_PRIORITY, MAX_PRIORITY = 0, 9


class Budget(BaseModel):
    """Limits for one task, set at submission; None = unlimited in that dimension."""

    model_config = _STRICT

    tokens: int | None = Field(default=None, ge=0)
    model_calls: int | None = Field(default=None, ge=0)
    tool_calls: int | None = Field(default=None, ge=0)
    wall_time_s: float | None = Field(default=None, gt=0)
    money: float | None = Field(default=None, ge=0)


class SubmitTask(BaseModel):
    """Body of ``type: "task.submit"``: start a workflow run, idempotently by key."""

    model_config = _STRICT

    workflow: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    workflow_version: int | None = Field(default=None, ge=1)
    input: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str = Field(min_length=1, max_length=200)
    deadline_s: float | None = Field(default=None, gt=0)
    budget: Budget | None = None
    #: 0 (lowest) to 9: a node admits a tenant's higher priorities first, within the
    #: tenant's share (docs/operations.md); not part of the request (a repeat of the key
    #: with another priority is the same request).
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)


class TaskAccepted(BaseModel):
    """``result`` of a successful submit: the task (new, or the one this key made before)."""

    model_config = _STRICT

    task_id: str
    status: str
    created: bool


class GetTask(BaseModel):
    """Body of ``type: "task.get"``."""

    model_config = _STRICT

    task_id: str = Field(min_length=1, max_length=128)


class TaskSnapshot(BaseModel):
    """What a task is now: the row of record, as ``ratchet status`` shows it."""

    model_config = _LENIENT

    task_id: str
    tenant: str
    workflow: str
    workflow_version: int
    status: str
    version: int
    next_step: int
    steps_total: int | None = None
    last_checkpoint: int
    last_event_sequence: int
    error: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    created_at: float
    updated_at: float
    #: A sandbox fork's marks (``source``, ``reuse_model``); None for any other task.
    sandbox: dict[str, Any] | None = None


class StartTask(BaseModel):
    """Body of the actor mail ``type: "task.start"`` sent to a task actor."""

    model_config = _STRICT

    task_id: str
    tenant: str
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)


class ApprovalDecision(BaseModel):
    """Body of ``type: "approval.decision"`` on ``ratchet.decisions.<tenant>``.

    ``approval_id`` is one-time and names the exact request (``request_hash``, optional:
    when given it must match the pending request) being decided. The admin command set
    (another issue) wraps this message with authorisation; the runtime re-validates the
    approval (pending, not expired, same task node) just before acting.
    """

    model_config = _STRICT

    task_id: str = Field(min_length=1, max_length=128)
    approval_id: str = Field(min_length=1, max_length=128)
    decision: Literal["approve", "reject"]
    #: Ignored on the wire: the node records the verified signer (docs/security.md).
    decided_by: str | None = Field(default=None, max_length=200)
    reason: str | None = Field(default=None, max_length=2000)
    request_hash: str | None = None


class Principal(BaseModel):
    """A display name a client may put in an admin command. It decides nothing: who acts,
    and with which roles, comes from the command's signature and the node's keyring
    (docs/security.md); the node overwrites it with the verified principal's name."""

    model_config = _STRICT

    name: str = Field(min_length=1, max_length=200)
    roles: list[Literal["viewer", "operator", "approver"]] = Field(default_factory=list)


class AdminCommand(BaseModel):
    """Body of ``type: "admin.<verb>"`` on ``ratchet.admin.<tenant>.<verb>``.

    ``command_id``: repeating it returns the first answer (one effect). ``expected_version``:
    for verbs that change a task, a mismatch is CONFLICT.
    """

    model_config = _STRICT

    command_id: str = Field(min_length=1, max_length=128)
    principal: Principal | None = None
    task_id: str | None = Field(default=None, max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)
    expected_version: int | None = Field(default=None, ge=1)


class Event(BaseModel):
    """A fact about a task, as subscribers receive it (ARCHITECTURE §8).

    ``sequence`` is per task and contiguous from 1; ``aggregate_version`` is the task's
    ``version`` after the change that produced the event.
    """

    model_config = _LENIENT

    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: str
    task_id: str
    tenant: str
    sequence: int = Field(ge=1)
    type: str
    aggregate_version: int
    occurred_at: float
    producer: str
    payload: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    model_config = _LENIENT

    code: str
    message: str
    retryable: bool = False
    details: dict[str, Any] = Field(default_factory=dict)


class Reply(BaseModel):
    """Every request/reply answer: ``{ok: true, result}`` or ``{ok: false, error}``."""

    model_config = _LENIENT

    schema_version: Literal[1] = SCHEMA_VERSION
    ok: bool
    correlation_id: str | None = None
    result: dict[str, Any] | None = None
    error: ErrorBody | None = None
