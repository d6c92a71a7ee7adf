"""What a task actor is given and told, and how a task ends when its actor cannot end it.

:class:`TaskDeps` (the node's store, registry, clock and hooks, shared by every task actor
of the node), the messages a task actor takes from outside (:class:`Advance`,
:class:`DeliverMail`), :func:`error_of` (the error record of a failed task) and
:func:`fail_task` (a supervisor giving a task up). None of it needs a live task actor, so
it imports nothing of ``actors/task/actor.py``, which re-exports every name.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from ratchet.actors.agents.degrade import AnswerCache
from ratchet.actors.core.actor import Actor, ActorRef
from ratchet.actors.effects.remote_tool import RemoteAsk, no_remote_tools
from ratchet.actors.effects.saga import pending_compensations
from ratchet.actors.effects.switches import Switches
from ratchet.actors.task.handoff_package import Where, build_package
from ratchet.actors.workflow.registry import Registry
from ratchet.persistence.checkpoints import MAX_CHECKPOINT_BYTES, MAX_VALUE_BYTES
from ratchet.persistence.ports import TaskStore
from ratchet.persistence.txns import TaskChange
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.messages import Envelope
from ratchet.protocol.redaction import LIVE, redact
from ratchet.protocol.states import TaskEvent, TaskStatus, is_terminal
from ratchet.protocol.subjects import DEFAULT_PARTITIONS

__all__ = ["TaskDeps", "TaskChildren", "TaskHooks", "ChildToStart", "NoChildren", "NoHooks", "Advance", "DeliverMail", "error_of", "fail_task"]

log = structlog.get_logger("ratchet.task")


#: A child of a task's supervisor to start: ``(id, factory(restarts), shutdown_timeout)``.
ChildToStart = tuple[str, Callable[[int], Actor], float]


class TaskChildren(Protocol):
    """The task supervisor's other children, as a task actor manages them: tool sessions,
    fan-out branches and joins. Implemented by the node's task supervision."""

    async def session(self, task_id: str, tenant: str, name: str) -> ActorRef[Any]:
        """The task's live tool session ``name`` (started if need be)."""

    async def spawn_children(self, task_id: str,
                             children: list[ChildToStart]) -> list[ActorRef[Any]]:
        """Start (or find) children of the task's supervisor, in order."""

    async def stop_children(self, task_id: str, child_ids: list[str] | None) -> None:
        """Stop these children (None: every child but the task actor)."""

    def tell_task(self, task_id: str, message: Any) -> bool:
        """Tell the task's live actor (it may have been restarted); False if none."""

    def lookup_child(self, task_id: str, child_id: str) -> ActorRef[Any] | None:
        """The live child ``child_id`` of the task's supervisor, if any."""


class TaskHooks(Protocol):
    """What the node wants to hear from its task actors (admission, recovery evidence)."""

    def task_active(self, task_id: str, tenant: str) -> None:
        """An actor of a QUEUED or RUNNING task started (it holds a running slot)."""

    def task_stopped(self, task_id: str) -> None:
        """A task actor stopped (its slot goes to the next task)."""

    def recovery_note(self, task_id: str) -> dict[str, Any] | None:
        """Fields merged into the ``task.recovered`` event of a task this node activates
        (a ``reason`` replaces "node_recovery"), or None. Not asked for an actor restarted
        by its supervisor."""


class NoChildren:
    """For a task actor run without a task supervisor (unit tests of one behaviour): any
    attempt to start a child is an error."""

    async def session(self, task_id: str, tenant: str, name: str) -> ActorRef[Any]:
        raise RatchetError("no task supervisor: tool sessions unavailable", task_id=task_id)

    async def spawn_children(self, task_id: str,
                             children: list[ChildToStart]) -> list[ActorRef[Any]]:
        raise RatchetError("no task supervisor: cannot start children", task_id=task_id)

    async def stop_children(self, task_id: str, child_ids: list[str] | None) -> None:
        return None

    def tell_task(self, task_id: str, message: Any) -> bool:
        return False

    def lookup_child(self, task_id: str, child_id: str) -> ActorRef[Any] | None:
        return None


class NoHooks:
    """Nobody listening: no admission accounting, no recovery evidence."""

    def task_active(self, task_id: str, tenant: str) -> None:
        return None

    def task_stopped(self, task_id: str) -> None:
        return None

    def recovery_note(self, task_id: str) -> dict[str, Any] | None:
        return None


@dataclass
class TaskDeps:
    """What every task actor of a node is given (shared by all of them)."""

    store: TaskStore
    registry: Registry
    clock: Clock
    producer: str
    max_step_attempts: int = 3
    #: The task supervisor's other children (the node's task supervision gives each task
    #: actor a copy of these deps naming itself).
    children: TaskChildren = field(default_factory=NoChildren)
    hooks: TaskHooks = field(default_factory=NoHooks)
    switches: Switches | None = None  # the node's kill switches
    rng: random.Random = field(default_factory=random.Random)
    #: Crash-loop guard (actors/task/crash_loop.py): a recovery that makes more than
    #: ``max_recoveries`` within ``recovery_window`` seconds hands the task to a human.
    max_recoveries: int = 3
    recovery_window: float = 600.0
    #: At most one ``task.progress`` event per this many seconds (actors/task/progress.py).
    progress_interval: float = 5.0
    #: The deployment's partition count (mail subjects carry the task's partition).
    partitions: int = DEFAULT_PARTITIONS
    #: Bounds on a task's state (persistence/checkpoints.py): one value's encoding, and
    #: the values one checkpoint writes; a step over either fails with INVALID_STATE_VALUE.
    max_value_bytes: int = MAX_VALUE_BYTES
    max_checkpoint_bytes: int = MAX_CHECKPOINT_BYTES
    #: Agent nodes' recorded answers, for ``Degradation(cached=True)`` (bounded, per node).
    answers: AnswerCache = field(default_factory=AnswerCache)
    #: How long a cancel waits for a write in flight before it detaches it (the action
    #: sweeper settles it later: actors/task/open_actions.py).
    cancel_timeout: float = 30.0
    #: How every tool call is asked: the node's ``ToolCalls`` (actors/effects/tool_calls.py;
    #: the name is from when only remote tools went that way); without a node, in-process
    #: tools through a local worker of their own, remote ones refused.
    remote_ask: RemoteAsk = no_remote_tools
    #: Where fan-out branches run: the node's ``actors/task/branch_host.BranchHost`` (typed
    #: loosely: it is built on these deps); None without a node's task supervision.
    branches: Any = None

    def __post_init__(self) -> None:
        if self.max_recoveries < 0:
            raise ValueError(f"TaskDeps.max_recoveries must be >= 0, not {self.max_recoveries}")
        if self.recovery_window <= 0:
            raise ValueError(
                f"TaskDeps.recovery_window must be > 0 seconds, not {self.recovery_window}")
        if self.progress_interval < 0:
            raise ValueError(
                f"TaskDeps.progress_interval must be >= 0 seconds, not {self.progress_interval}")
        if not 0 < self.max_value_bytes <= self.max_checkpoint_bytes:
            raise ValueError("TaskDeps needs 0 < max_value_bytes <= max_checkpoint_bytes, not"
                             f" {self.max_value_bytes} and {self.max_checkpoint_bytes}")


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
    a live actor, and the actor is what keeps crashing. No-op if already terminal. The
    error is cut free of the secrets the task's last actor knew (a trace may quote them)."""
    error = redact(error_of(cause, reason), LIVE.of(task_id))
    LIVE.discard(task_id)
    for _ in range(5):
        rec = await deps.store.load_task(task_id)
        if is_terminal(TaskStatus(rec.status)):
            return
        pending = (await pending_compensations(deps.store, deps.registry, task_id)
                   if rec.status == TaskStatus.RUNNING.value else [])
        if pending:
            keys = [a.key for a in pending]
            where = Where(rec.current_node, rec.next_step, [], dict(rec.spent), deps.clock.now())
            package = await build_package(deps.store, deps.registry, rec, where, reason, {
                "why": reason, "error": error, "pending_compensations": keys})
            change = TaskChange(
                task_id=task_id, expected_version=rec.version, producer=deps.producer,
                now=deps.clock.now(), status_event=TaskEvent.WAITING_APPROVAL, error=error,
                events=[(EventType.TASK_HANDOFF, {"reason": reason, "error": error,
                                          "pending_compensations": keys})],
                handoff=(reason, package))
        else:
            change = TaskChange(
                task_id=task_id, expected_version=rec.version, producer=deps.producer,
                now=deps.clock.now(), status_event=TaskEvent.FAILED,
                events=[(EventType.TASK_FAILED, {"reason": reason, "error": error})], error=error)
        try:
            await deps.store.apply(change)
            log.error("task given up by its supervisor", task_id=task_id, reason=reason)
            return
        except RatchetError as exc:
            if exc.code.value != "CONFLICT":
                raise
