"""Contracts only: wire models, codec, subjects, ids, the task state machine, every error
class (``errors``), the catalogue of message and event types (``catalogue``), the event
encoder (``events``).

Imports nothing else of Ratchet's.
"""

from ratchet.protocol.clock import Clock, FakeClock, SystemClock
from ratchet.protocol.codec import canonical, decode_envelope, decode_map, encode, parse_body
from ratchet.protocol.errors import (
    ActorCrashed,
    ActorStopped,
    AskTimeout,
    DuplicateMessage,
    ErrorCode,
    Escalation,
    IllegalTransition,
    InvalidMessage,
    NotFound,
    RatchetError,
    RemoteError,
    RequestConflict,
    Unavailable,
    UnknownWorkflow,
    VersionConflict,
    WorkflowDefinitionError,
)
from ratchet.protocol.ids import new_id, request_hash, task_id_for
from ratchet.protocol.messages import (
    SCHEMA_VERSION,
    Envelope,
    ErrorBody,
    Event,
    GetTask,
    Reply,
    StartTask,
    SubmitTask,
    TaskAccepted,
    TaskSnapshot,
)
from ratchet.protocol.states import (
    TERMINAL,
    TRANSITIONS,
    TaskEvent,
    TaskStatus,
    is_terminal,
    transition,
)

__all__ = [
    "Clock",
    "FakeClock",
    "SystemClock",
    "canonical",
    "decode_envelope",
    "decode_map",
    "encode",
    "parse_body",
    "ErrorCode",
    "IllegalTransition",
    "InvalidMessage",
    "NotFound",
    "RatchetError",
    "RequestConflict",
    "Unavailable",
    "UnknownWorkflow",
    "VersionConflict",
    "ActorCrashed",
    "ActorStopped",
    "AskTimeout",
    "DuplicateMessage",
    "Escalation",
    "RemoteError",
    "WorkflowDefinitionError",
    "new_id",
    "request_hash",
    "task_id_for",
    "SCHEMA_VERSION",
    "Envelope",
    "ErrorBody",
    "Event",
    "GetTask",
    "Reply",
    "StartTask",
    "SubmitTask",
    "TaskAccepted",
    "TaskSnapshot",
    "TERMINAL",
    "TRANSITIONS",
    "TaskEvent",
    "TaskStatus",
    "is_terminal",
    "transition",
]
