"""The task actor: runs one task's sequential workflow, one durable step at a time.

Each step ends in one store transaction (compare-and-set on the task version) holding the
checkpoint delta, the ``step.completed`` event and its outbox row. Between steps the actor
sends itself ``Advance``, so other mail (and a stop) is handled at step boundaries, the
task's safe points. A step that raises records ``step.failed`` and crashes the actor; its
supervisor starts a fresh actor that reloads the last checkpoint, so committed steps never
run again.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any

import structlog

from actors.core import Actor
from actors.workflow import Registry, StepContext, Workflow, bind_step_logger
from persistence.checkpoints import StateTracker
from persistence.store import Store, TaskRecord
from persistence.txns import CheckpointWrite, DuplicateMessage, TaskChange
from protocol.clock import Clock
from protocol.errors import RatchetError
from protocol.messages import Envelope
from protocol.states import TaskEvent, TaskStatus, is_terminal

__all__ = ["TaskActor", "TaskDeps", "Advance", "DeliverMail", "fail_task"]

log = structlog.get_logger("ratchet.task")


@dataclass(frozen=True, slots=True)
class TaskDeps:
    store: Store
    registry: Registry
    clock: Clock
    producer: str


@dataclass(frozen=True, slots=True)
class Advance:
    """Run the next step (self-sent after each commit)."""


@dataclass(frozen=True, slots=True)
class DeliverMail:
    envelope: Envelope


class TaskActor(Actor):
    def __init__(self, task_id: str, deps: TaskDeps, restarts: int = 0) -> None:
        self.task_id = task_id
        self.deps = deps
        self.restarts = restarts
        self.log = log.bind(task_id=task_id)
        self.record: TaskRecord | None = None
        self.workflow: Workflow | None = None
        self.state: dict[str, Any] = {}
        self.tracker = StateTracker()
        self.version = 0
        self.status = TaskStatus.QUEUED
        self.next_step = 0
        self._recovered_from: str | None = None
        self._attempt = 1

    # -- hooks -------------------------------------------------------------------------

    async def on_start(self) -> None:
        """Load the task and its last checkpoint; queue an Advance if it can run."""
        rec = await self.deps.store.load_task(self.task_id)
        self.record = rec
        self.version, self.status, self.next_step = rec.version, TaskStatus(rec.status), rec.next_step
        self.log = self.log.bind(tenant=rec.tenant, workflow=rec.workflow)
        self._attempt = rec.step_failures + 1
        if is_terminal(self.status):
            self.ref.stop()
            return
        self.workflow = self.deps.registry.get(rec.workflow, rec.workflow_version)
        loaded = await self.deps.store.load_state(self.task_id)
        self.state = loaded.values
        self.tracker = StateTracker(loaded.encoded)
        for digest in loaded.blobs:
            self.tracker.note_stored_blob(digest)
        if self.status is TaskStatus.RUNNING:
            # Either our supervisor restarted us or a node is recovering the task.
            self._recovered_from = "actor_restart" if self.restarts else "node_recovery"
        if self.status in (TaskStatus.QUEUED, TaskStatus.RUNNING):
            self.ref.tell(Advance())

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Advance):
            await self._advance()
            return None
        if isinstance(message, DeliverMail):
            return await self._deliver(message.envelope)
        return await super().receive(message)

    # -- mail ---------------------------------------------------------------------------

    async def _deliver(self, env: Envelope) -> str:
        if env.type != "task.start":
            self.log.warning("unexpected mail dropped", type=env.type, message_id=env.message_id)
            return "ignored"
        if self.status is not TaskStatus.QUEUED:
            return "duplicate"
        try:
            await self._dispatch(inbox_message_id=env.message_id)
        except DuplicateMessage:
            return "duplicate"
        return "processed"

    # -- execution ----------------------------------------------------------------------

    async def _commit(self, change: TaskChange) -> None:
        result = await self.deps.store.apply(change)
        self.version, self.status = result.version, result.status

    def _change(self, **kwargs: Any) -> TaskChange:
        return TaskChange(
            task_id=self.task_id,
            expected_version=self.version,
            producer=self.deps.producer,
            now=self.deps.clock.now(),
            **kwargs,
        )

    async def _dispatch(self, inbox_message_id: str | None = None) -> None:
        assert self.workflow is not None
        await self._commit(self._change(
            status_event=TaskEvent.DISPATCHED,
            events=[("task.started", {"steps_total": len(self.workflow.steps),
                                      "node": self.deps.producer})],
            inbox_message_id=inbox_message_id,
        ))

    async def _advance(self) -> None:
        if is_terminal(self.status) or self.workflow is None:
            self.ref.stop()
            return
        if self.status is TaskStatus.QUEUED:
            await self._dispatch()
        if self.status is not TaskStatus.RUNNING:
            return  # waiting or paused: a later message resumes it
        steps = self.workflow.steps
        if self._recovered_from is not None:
            skipped = [s.name for s in steps[: self.next_step]]
            await self._commit(self._change(events=[("task.recovered", {
                "reason": self._recovered_from,
                "from_checkpoint": self.record.last_checkpoint if self.record else 0,
                "next_step": self.next_step,
                "steps_skipped": skipped,
                "restarts": self.restarts,
            })]))
            self.log.info("task recovered", reason=self._recovered_from, next_step=self.next_step)
            self._recovered_from = None
        if self.next_step >= len(steps):
            await self._succeed()
            return
        await self._run_step(self.next_step)
        self.ref.tell(Advance())

    async def _run_step(self, index: int) -> None:
        assert self.workflow is not None and self.record is not None
        step = self.workflow.steps[index]
        ctx = StepContext(
            task_id=self.task_id, tenant=self.record.tenant, workflow=self.workflow.name,
            step_name=step.name, step_index=index, attempt=self._attempt,
            input=self.record.input, state=self.state, clock=self.deps.clock,
            log=bind_step_logger(self.task_id, self.record.tenant, step.name),
        )
        started = time.perf_counter()
        try:
            update = await step.fn(ctx)
            if update:
                self.state.update(update)
            delta = self.tracker.diff(self.state)
        except Exception as exc:
            await self._commit(self._change(step_failed=True, events=[("step.failed", {
                "step": step.name, "index": index, "attempt": ctx.attempt,
                "error": {"type": type(exc).__name__, "message": str(exc)[:2000]},
            })]))
            self.log.warning("step failed", step=step.name, attempt=ctx.attempt, error=repr(exc))
            raise
        duration = time.perf_counter() - started
        await self._commit(self._change(
            events=[("step.completed", {"step": step.name, "index": index,
                                        "duration_ms": round(duration * 1000, 3),
                                        "changed": [v.key for v in delta.values]})],
            checkpoint=CheckpointWrite(index, step.name, index + 1, delta),
        ))
        self.next_step = index + 1
        self._attempt = 1

    async def _succeed(self) -> None:
        raw = self.state.get("output")
        output = raw if isinstance(raw, dict) else ({"value": raw} if raw is not None else {})
        await self._commit(self._change(
            status_event=TaskEvent.SUCCEEDED,
            events=[("task.succeeded", {"output": output})],
            output=output,
        ))
        self.log.info("task succeeded")
        self.ref.stop()


async def fail_task(deps: TaskDeps, task_id: str, cause: BaseException | None, reason: str) -> None:
    """End a task in FAILED (used when its supervisor gives up). No-op if already terminal."""
    for _ in range(5):
        rec = await deps.store.load_task(task_id)
        if is_terminal(TaskStatus(rec.status)):
            return
        error = {
            "code": cause.code.value if isinstance(cause, RatchetError) else "INTERNAL",
            "reason": reason,
            "type": type(cause).__name__ if cause else None,
            "message": str(cause)[:2000] if cause else None,
            "trace": "".join(traceback.format_exception(cause))[-4000:] if cause else None,
        }
        try:
            await deps.store.apply(TaskChange(
                task_id=task_id, expected_version=rec.version, producer=deps.producer,
                now=deps.clock.now(), status_event=TaskEvent.FAILED,
                events=[("task.failed", {"reason": reason, "error": error})], error=error,
            ))
            log.error("task failed", task_id=task_id, reason=reason)
            return
        except RatchetError as exc:
            if exc.code.value != "CONFLICT":
                raise
