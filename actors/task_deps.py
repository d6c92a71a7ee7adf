"""What a task actor is given and told, and how a task ends when its actor cannot end it.

:class:`TaskDeps` (the node's store, registry, clock and hooks, shared by every task actor
of the node), the messages a task actor takes from outside (:class:`Advance`,
:class:`DeliverMail`), :func:`error_of` (the error record of a failed task) and
:func:`fail_task` (a supervisor giving a task up). None of it needs a live task actor, so
it imports nothing of ``actors/task_actor.py``, which re-exports every name.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass, field
from typing import Any

import structlog

from ratchet.actors.saga import pending_compensations
from ratchet.actors.workflow import Registry
from ratchet.persistence.ports import TaskStore
from ratchet.persistence.txns import TaskChange
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus, is_terminal
from ratchet.protocol.subjects import DEFAULT_PARTITIONS

__all__ = ["TaskDeps", "Advance", "DeliverMail", "error_of", "fail_task"]

log = structlog.get_logger("ratchet.task")


@dataclass
class TaskDeps:
    store: TaskStore
    registry: Registry
    clock: Clock
    producer: str
    max_step_attempts: int = 3
    #: ``session(task_id, tenant, name)`` → the live tool-session actor; ``spawn_children(
    #: task_id, [(child_id, factory)])`` and ``stop_children(task_id, [child_id])`` manage the
    #: task supervisor's other children (branches, joins). All set by TaskSupervision.
    sessions: Any = None
    spawn_children: Any = None
    stop_children: Any = None
    tell_task: Any = None
    lookup_child: Any = None  # (task_id, child_id) → the live child of the task supervisor
    switches: Any = None  # actors.switches.Switches (kill switches), shared by the node
    rng: random.Random = field(default_factory=random.Random)
    #: Crash-loop guard (actors/crash_loop.py): a recovery that makes more than
    #: ``max_recoveries`` within ``recovery_window`` seconds hands the task to a human.
    max_recoveries: int = 3
    recovery_window: float = 600.0
    #: ``recovery_note(task_id)`` → fields merged into the ``task.recovered`` event of a task
    #: this node activates (a ``reason`` replaces "node_recovery"), or None; may be async.
    #: Set by the node; not called for an actor restarted by its supervisor.
    recovery_note: Any = None
    #: At most one ``task.progress`` event per this many seconds (actors/progress.py).
    progress_interval: float = 5.0
    #: Admission accounting (the node's fair scheduler): called with (task_id, tenant) when
    #: an actor of a QUEUED or RUNNING task starts, and with task_id when it stops.
    on_active: Any = None
    on_stopped: Any = None
    #: The deployment's partition count (mail subjects carry the task's partition).
    partitions: int = DEFAULT_PARTITIONS

    def __post_init__(self) -> None:
        if self.max_recoveries < 0:
            raise ValueError(f"TaskDeps.max_recoveries must be >= 0, not {self.max_recoveries}")
        if self.recovery_window <= 0:
            raise ValueError(
                f"TaskDeps.recovery_window must be > 0 seconds, not {self.recovery_window}")
        if self.progress_interval < 0:
            raise ValueError(
                f"TaskDeps.progress_interval must be >= 0 seconds, not {self.progress_interval}")


@dataclass(frozen=True, slots=True)
class Advance:
    """Run the next step (self-sent after each commit)."""


@dataclass(frozen=True, slots=True)
class DeliverMail:
    envelope: Envelope


def error_of(cause: BaseException | None, reason: str) -> dict[str, Any]:
    return {
        "code": cause.code.value if isinstance(cause, RatchetError) else "INTERNAL",
        "reason": reason,
        "type": type(cause).__name__ if cause else None,
        "message": str(cause)[:2000] if cause else None,
        "trace": "".join(traceback.format_exception(cause))[-4000:] if cause else None,
    }


async def fail_task(deps: TaskDeps, task_id: str, cause: BaseException | None, reason: str) -> None:
    """End a task whose supervisor gave up. With side effects left to compensate it goes to
    a human (WAITING_APPROVAL with a handoff package) instead of FAILED: compensation needs
    a live actor, and the actor is what keeps crashing. No-op if already terminal."""
    error = error_of(cause, reason)
    for _ in range(5):
        rec = await deps.store.load_task(task_id)
        if is_terminal(TaskStatus(rec.status)):
            return
        pending = (await pending_compensations(deps.store, deps.registry, task_id)
                   if rec.status == TaskStatus.RUNNING.value else [])
        if pending:
            keys = [a.key for a in pending]
            change = TaskChange(
                task_id=task_id, expected_version=rec.version, producer=deps.producer,
                now=deps.clock.now(), status_event=TaskEvent.WAITING_APPROVAL, error=error,
                events=[("task.handoff", {"reason": reason, "error": error,
                                          "pending_compensations": keys})],
                handoff=(reason, {"why": reason, "error": error,
                                  "pending_compensations": keys}))
        else:
            change = TaskChange(
                task_id=task_id, expected_version=rec.version, producer=deps.producer,
                now=deps.clock.now(), status_event=TaskEvent.FAILED,
                events=[("task.failed", {"reason": reason, "error": error})], error=error)
        try:
            await deps.store.apply(change)
            log.error("task given up by its supervisor", task_id=task_id, reason=reason)
            return
        except RatchetError as exc:
            if exc.code.value != "CONFLICT":
                raise
