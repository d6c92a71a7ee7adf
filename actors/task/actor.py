"""The task actor: runs one task's sequential workflow, one durable step at a time.

Each step ends in one transaction (compare-and-set on the task version): checkpoint delta,
``step.completed`` and its outbox row; between steps the actor sends itself ``Advance``, so
other mail (and a stop) is handled at step boundaries, the task's safe points.

A step that raises records ``step.failed``; an :class:`ActionFailed` or its last allowed
attempt gives up (exhausted.py: the saga then FAILED, or a human); else the actor crashes
and restarts from the last checkpoint (the ledger answers the re-run's completed calls).

A step may suspend the task (actors/task/suspension.py): the actor passivates. A fresh actor
for a started task records ``task.recovered`` (crash_loop.py) and settles its writes first
(settle_task.py). Behaviours see the actor as a TaskKernel (kernel.py); mail table: mail.py.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import structlog

from ratchet.actors.core.actor import Actor, ActorRef
from ratchet.actors.effects.actions import ActionRunner, TaskSuspended
from ratchet.actors.task import control as task_control
from ratchet.actors.task import (
    crash_loop,
    definition_guard,
    durability,
    exhausted,
    graph_runtime,
    loop_runtime,
    revalidate,
    settle_task,
)
from ratchet.actors.task.deps import Advance, DeliverMail, TaskDeps, error_of, fail_task
from ratchet.actors.task.mail import MAIL
from ratchet.actors.task.node_guard import NodeGuard
from ratchet.actors.task.open_actions import OpenActions, mark_cancelling
from ratchet.actors.task.progress import ProgressMeter, progress_payload
from ratchet.actors.task.sandbox_task import enter_task
from ratchet.actors.task.slow_step import warn_if_slow
from ratchet.actors.task.start_state import initial_state
from ratchet.actors.task.step_runner import step_heartbeat, step_runner
from ratchet.actors.task.step_sleep import StepSleeper
from ratchet.actors.task.suspension import fail_with_saga, pause, suspend
from ratchet.actors.task.task_secrets import TaskSecrets
from ratchet.actors.workflow.nodes import END, StepContext, StepNode
from ratchet.actors.workflow.registry import Workflow, bind_step_logger
from ratchet.actors.workflow.revalidate import AFTER
from ratchet.persistence import CheckpointWrite, StateDelta, StateTracker, TaskChange, TaskRecord
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import (
    ActionFailed,
    BudgetExhausted,
    DuplicateMessage,
    InvalidStateValue,
    RatchetError,
    UnknownWorkflow,
    WorkflowDefinitionError,
)
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus, is_terminal

__all__ = ["TaskActor", "TaskDeps", "Advance", "DeliverMail", "fail_task"]

log = structlog.get_logger("ratchet.task")

#: Step failures that end the task at once (a re-run cannot help), with their reason.
_FOR_GOOD = ((ActionFailed, "a side effect failed"), (BudgetExhausted, "budget exhausted"),
             (InvalidStateValue, "invalid state value"),
             (WorkflowDefinitionError, "invalid workflow definition"))  # e.g. ctx.sleep


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
        self.secrets = TaskSecrets(task_id)  # actors/task/task_secrets.py
        self.version = 0
        self.status = TaskStatus.QUEUED
        self.next_step = 0  # nodes completed so far (progress)
        self.current: str = END  # the node to run next (END: finished)
        self.visits: dict[str, int] = {}
        self.spent: dict[str, float] = {}
        self._recovered_from: str | None = None
        self.checkpoint_seq = 0  # the last checkpoint written (kept in step with commits)
        self._progress = ProgressMeter(deps.progress_interval)
        self._attempt = 1
        self.joins: dict[str, ActorRef[Any]] = {}  # live join actors by fan-out key
        self.conversations: dict[str, Any] = {}  # agent nodes' conversations, by node
        self.open_actions = OpenActions()  # writes under way; what a cancel may cut short
        self.pause_requested = False
        self.revalidation: str | None = None  # why it stood still (actors/task/revalidate.py)
        self.node_guard = NodeGuard()  # node loop detection, hooked into move
        self.undurable: asyncio.Future[None] | None = None  # actors/task/durability.py

    # -- hooks -------------------------------------------------------------------------

    async def on_start(self) -> None:
        """Load the task and its last checkpoint; queue an Advance if it can run."""
        opened = self.deps.store.secrets.opened
        rec = await self.deps.store.load_task(self.task_id)
        self.record = rec
        self.version, self.status, self.next_step = rec.version, TaskStatus(rec.status), rec.next_step
        self.visits, self.spent = dict(rec.visits), dict(rec.spent)
        enter_task(self, rec)  # its trace; a sandbox fork's log marks (sandbox_task.py)
        self.log = self.log.bind(tenant=rec.tenant, workflow=rec.workflow)
        self._attempt, self.checkpoint_seq = rec.step_failures + 1, rec.last_checkpoint
        self._progress.mark(self.deps.clock.now())  # the first heartbeat one interval from now
        if is_terminal(self.status):
            await settle_task.after_end(self)  # what it left unsettled (the action sweeper)
            self.ref.stop()
            return
        self.open_actions.settle_due = self.status is not TaskStatus.QUEUED
        if self.status in (TaskStatus.QUEUED, TaskStatus.RUNNING):
            self.deps.hooks.task_active(self.task_id, rec.tenant)
        try:
            self.workflow = self.deps.registry.get(rec.workflow, rec.workflow_version)
        except UnknownWorkflow as exc:
            # Restarting cannot help: say so once, loudly, instead of crash-looping.
            error = error_of(exc, "workflow not registered on this node")
            await self.commit(status_event=TaskEvent.FAILED, error=error, events=[(
                EventType.TASK_FAILED, {"reason": "workflow not registered on this node",
                                "node": self.deps.producer, "error": error})])
            self.ref.stop()
            return
        self.current = rec.current_node or self.workflow.start
        loaded = await initial_state(self.deps.store, rec)  # no read before a checkpoint
        self.state = loaded.values
        self.secrets.loaded(self.deps.store.secrets, opened, rec.input, loaded.values)
        self.tracker = StateTracker(loaded.encoded, blobs=loaded.blobs, values=loaded.values,
                                    max_value_bytes=self.deps.max_value_bytes,
                                    max_checkpoint_bytes=self.deps.max_checkpoint_bytes,
                                    default=self.deps.store.secrets.default)
        if self.status is TaskStatus.RUNNING:
            # Either our supervisor restarted us or a node is recovering the task.
            self._recovered_from = "actor_restart" if self.restarts else "node_recovery"
        if rec.control and await task_control.apply_pending_control(self):
            return
        self.pause_requested = "pause" in rec.control  # parked meanwhile: at the next point
        await definition_guard.check_definition(self)  # changed code: pause, never run it
        self.revalidation = AFTER.get(self.status.value)  # re-validate once it goes on
        if self.status in (TaskStatus.QUEUED, TaskStatus.RUNNING):
            self.ref.tell(Advance())

    def request_pause(self) -> None:
        """Out of band: pause at the next safe point, which may be the next tool call of the
        step in progress (the step then runs again on resume; its completed calls are
        answered by the ledger)."""
        self.pause_requested = True

    def interrupt(self) -> bool:
        """Abandon the step in progress, if any, once no write of it is in flight (called on
        the loop, from outside, for an operator's cancel; the step is not committed and the
        control mail comes next: actors/task/open_actions.py)."""
        return self.open_actions.interrupt(self.deps.cancel_timeout, functools.partial(
            mark_cancelling, self.deps.store, self.task_id, self.deps.producer, self.deps.clock))

    async def on_stop(self) -> None:
        self.secrets.release(running=self.status in (TaskStatus.QUEUED, TaskStatus.RUNNING))
        try:
            await graph_runtime.stop_fanout_children(self)
        finally:
            self.deps.hooks.task_stopped(self.task_id)  # its running slot goes to the next task

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Advance):
            await self._advance()
            return None
        if isinstance(message, DeliverMail):
            return await self._deliver(message.envelope)
        if isinstance(message, graph_runtime.JoinDone | graph_runtime.WindowMoved):
            await graph_runtime.on_join_done(self, message)  # a verdict, or the window moved
            return None
        return await super().receive(message)

    # -- mail ---------------------------------------------------------------------------

    async def _deliver(self, env: Envelope) -> str:
        outcome = await self._deliver_one(env)
        await durability.settled(self)  # no answer rests on a change not yet on disk
        if self.status not in (TaskStatus.QUEUED, TaskStatus.RUNNING) and self.ref.is_alive:
            self.ref.stop()  # still parked (late, repeated or refused mail): stay passivated
        return outcome

    async def _deliver_one(self, env: Envelope) -> str:
        try:
            for handle in MAIL.get(env.type, ()):
                outcome = await handle(self, env)
                if outcome is not None:
                    return outcome
        except DuplicateMessage:
            return "duplicate"
        self.log.warning("unexpected mail dropped", type=env.type, message_id=env.message_id)
        return "ignored"

    async def start(self, env: Envelope) -> str:
        if self.status is not TaskStatus.QUEUED:
            return "duplicate"
        if self._frozen():
            return "frozen"  # dispatched when thawed
        await self._dispatch(inbox_message_id=env.message_id)
        return "processed"

    # -- the kernel (actors/task/kernel.py) --------------------------------------------

    def advance(self) -> None:
        self.ref.tell(Advance())

    def passivate(self) -> None:
        self.ref.stop()

    # -- commits ------------------------------------------------------------------------

    async def _commit(self, change: TaskChange) -> None:
        result = await self.deps.store.apply(change)
        durability.note(self, result.durable)  # pipelined: what mail answers wait for
        self.version, self.status = result.version, result.status
        self.checkpoint_seq = result.last_checkpoint

    def _change(self, **kwargs: Any) -> TaskChange:
        kwargs = self.open_actions.with_reads(kwargs)  # recorded reads ride (read_record.py)
        return TaskChange(task_id=self.task_id, expected_version=self.version,
                          producer=self.deps.producer, now=self.deps.clock.now(),
                          **self.secrets.scrub(kwargs))  # what it shows quotes no secret

    async def commit(self, **kwargs: Any) -> None:
        """Commit a change under this actor's version (the action runner's callback)."""
        await self._commit(self._change(**kwargs))
        if kwargs.get("spend"):
            self.spent = {k: self.spent.get(k, 0) + kwargs["spend"].get(k, 0)
                          for k in set(self.spent) | set(kwargs["spend"])}

    async def _dispatch(self, inbox_message_id: str | None = None) -> None:
        assert self.workflow is not None
        await self._commit(self._change(
            status_event=TaskEvent.DISPATCHED,
            events=[(EventType.TASK_STARTED, {"steps_total": self.workflow.step_count,
                                              "node": self.deps.producer})],
            inbox_message_id=inbox_message_id))

    # -- execution ----------------------------------------------------------------------

    def _frozen(self) -> bool:
        tenant = self.record.tenant if self.record is not None else ""
        return self.deps.switches is not None and self.deps.switches.frozen_for(tenant)

    async def _advance(self) -> None:
        if is_terminal(self.status) or self.workflow is None:
            self.ref.stop()
            return
        if self._frozen():
            return  # dispatch frozen: wait at this safe point until thawed
        if self.status is TaskStatus.QUEUED:
            await self._dispatch()
        if self.status is not TaskStatus.RUNNING:
            return  # waiting or paused: a later message resumes it
        if self.pause_requested:  # a pause that arrived while the task was parked
            await pause(self)
            return
        if self._recovered_from is not None:
            reason, self._recovered_from = self._recovered_from, None
            if not await crash_loop.record_recovery(self, reason):
                return  # a crash loop: handed to a human
        if self.open_actions.settle_due and not await settle_task.on_recovery(self):
            return  # a write nobody could settle: handed to a human
        assert self.record is not None
        # due_now: a forward step of the wall clock is held, not taken for the deadline passing.
        if self.record.deadline_at is not None \
                and self.deps.clock.due_now() >= self.record.deadline_at:
            await fail_with_saga(self, RatchetError("task deadline passed"), "deadline passed")
            return
        if self.revalidation is not None and not await revalidate.check_plan(self):
            return  # the plan no longer holds: handed to a human
        if self.current == END:
            await self._succeed()
            return
        node = self.workflow.node(self.current)
        bounded = [node]
        if node.kind == "fanout":  # a loop may be bounded on the join: entering its fan-out
            bounded.append(self.workflow.node(node.join))  # type: ignore[attr-defined]
        over = [n for n in bounded if n.max_visits is not None
                and self.visits.get(n.name, 0) >= n.max_visits]
        if over:
            await fail_with_saga(
                self, RatchetError(f"node {over[0].name} entered more than"
                                   f" {over[0].max_visits} times"), "loop bound exceeded")
            return
        if await graph_runtime.run_node(self, node):
            self.ref.tell(Advance())

    async def move(self, node: str, to: str, events: list[tuple[str, dict[str, Any]]],
                   count_visit: bool = True, delta: StateDelta | None = None,
                   visits: dict[str, int] | None = None, **kwargs: Any) -> None:
        """Commit leaving ``node`` for ``to`` as a checkpoint: the state changed (or ``delta``),
        ``visits`` as given (a loop's count) or counting this visit where it counts."""
        delta = self.tracker.diff(self.state) if delta is None else delta
        for _, payload in events:
            if "changed" in payload and payload["changed"] is None:
                payload["changed"] = [v.key for v in delta.values]  # the keys this node wrote
        if count_visit:  # not an agent's turn: its own detector watches those
            to = self.node_guard.observe(self.workflow, node, to, events, self.tracker)
        left = self.workflow.nodes.get(node) if self.workflow is not None else None
        if visits is None and count_visit and left is not None and left.counts_visits:
            visits = {**self.visits, node: self.visits.get(node, 0) + 1}  # not agent turns
        now = self.deps.clock.now()
        heartbeat = self._progress.due(now)
        if heartbeat:  # in this boundary's own transaction: progress costs no extra write
            assert self.record is not None
            events = [*events, (EventType.TASK_PROGRESS, progress_payload(
                node=to, steps_completed=self.next_step + 1, steps_total=self.record.steps_total,
                last_checkpoint=self.checkpoint_seq + 1, owner=self.deps.producer))]
        await self._commit(self._change(events=events, checkpoint=CheckpointWrite(
            self.next_step, node, self.next_step + 1, delta, next_node=to, visits=visits),
            **kwargs))
        if heartbeat:
            self._progress.mark(now)
        self.next_step += 1
        self.current = to
        self.visits = self.visits if visits is None else visits
        self._attempt = 1

    def runner(self, step_index: int, step_timeout: float | None,
               *, task_deadline: bool = True, count_tool_calls: bool = True) -> ActionRunner:
        """The action runner for one step (actors/task/step_runner.py)."""
        return step_runner(self, step_index, step_timeout, task_deadline=task_deadline,
                           count_tool_calls=count_tool_calls)

    async def run_step(self, step: StepNode) -> bool:
        """Run one step node; True when it committed and the task can go on."""
        assert self.workflow is not None and self.record is not None
        index = self.next_step
        ctx = StepContext(
            task_id=self.task_id, tenant=self.record.tenant, workflow=self.workflow.name,
            step_name=step.name, step_index=index, attempt=self._attempt,
            input=self.record.input, state=self.state, clock=self.deps.clock,
            log=bind_step_logger(self.task_id, self.record.tenant, step.name),
            runner=self.runner(index, step.timeout),
            iteration=loop_runtime.iteration_of(self, step),
            sleeper=StepSleeper(self, step.name, index), beat=step_heartbeat(self),
        )
        started = asyncio.get_running_loop().time()
        try:
            try:
                async with self.open_actions.interruptible(step.timeout), \
                        warn_if_slow(ctx.log, step.timeout, self._attempt):
                    update = await step.fn(ctx)
            except TimeoutError:
                if not self.open_actions.take_interrupt():
                    raise  # the step's own timeout: a step failure, handled below
                await self._commit(self._change(events=[(EventType.STEP_INTERRUPTED, {
                    "step": step.name, "index": index})]))
                return False  # the operator's request is handled next, at this safe point
            await settle_task.before_step_end(self)  # none of its writes left in doubt
            # Encoded and bounded before the state takes it (InvalidStateValue: for good).
            delta = self.tracker.diff({**self.state, **(update or {})})
            self.state.update(update or {})
        except TaskSuspended as signal:
            await suspend(self, signal)
            return False
        except Exception as exc:
            await self._record_step_failure(step.name, index, exc)
            for_good = next((r for kind, r in _FOR_GOOD if isinstance(exc, kind)), None)
            if for_good or self._attempt >= self.deps.max_step_attempts:
                await exhausted.give_up(self, step, exc, for_good, self._attempt)
                return False
            raise  # crash: the supervisor restarts us from the last checkpoint
        if step.kind == "loop":  # the iteration's one commit, and where the loop goes next
            return await loop_runtime.leave_iteration(self, step, index, started, delta)
        duration_ms = round((asyncio.get_running_loop().time() - started) * 1000, 3)
        await self.move(step.name, step.next, [(EventType.STEP_COMPLETED, {
            "step": step.name, "index": index, "duration_ms": duration_ms, "changed": None,
            "next": step.next})], delta=delta, pipelined=True)  # the next step need not wait
        return True

    async def _record_step_failure(self, name: str, index: int, exc: BaseException) -> None:
        await durability.record_step_failure(self, name, index, self._attempt, exc)
        self.log.warning("step failed", step=name, attempt=self._attempt, error=repr(exc))

    async def _succeed(self) -> None:
        if not await settle_task.before_success(self):
            return  # a write nobody could settle: handed to a human
        raw = self.state.get("output")
        output = raw if isinstance(raw, dict) else ({"value": raw} if raw is not None else {})
        await self._commit(self._change(
            status_event=TaskEvent.SUCCEEDED,
            events=[(EventType.TASK_SUCCEEDED, {"output": output})],
            output=output, control={},  # a request still pending has nothing left to act on
        ))
        self.log.info("task succeeded")
        self.ref.stop()

