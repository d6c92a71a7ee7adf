"""Task supervision: one supervisor per task, under the node's ``tasks`` supervisor.

``tasks`` (one_for_one, temporary children) → ``tasks/<task_id>`` (a TaskSupervisor:
one_for_one over the task actor, transient, restart intensity per task) → the task actor.
When the task actor keeps crashing past the intensity, the task supervisor ends the task in
FAILED with the cause (``on_escalate``) instead of crashing the node. When the task is done
(the actor stops normally) the task supervisor stops too, so finished and idle tasks cost
no live actors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

import structlog

from ratchet.actors.core.actor import Actor, ActorRef, ActorSystem
from ratchet.actors.effects.tool_session import ToolSession
from ratchet.actors.task.actor import Advance, TaskActor, TaskDeps, fail_task
from ratchet.actors.task.branch_host import BranchHost
from ratchet.persistence.ports import TaskRecord
from ratchet.protocol.errors import NotOwner, RatchetError, TaskFinished
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskStatus, is_terminal
from ratchet.protocol.subjects import partition_of
from ratchet.supervisors.supervision.restart_policy import Restart
from ratchet.supervisors.supervision.scheduler import FairScheduler
from ratchet.supervisors.supervision.supervisor import (
    ChildSpec,
    StartChild,
    StartChildren,
    StopChildren,
    Supervisor,
    WhichChildren,
)

__all__ = ["TASKS_ROOT", "TaskSupervision", "Ownership", "Forward", "task_actor_name",
           "task_supervisor_name"]

log = structlog.get_logger("ratchet.tasks")


#: Where the node spawns the tasks supervisor (``node`` → ``tasks``).
TASKS_ROOT = "node/tasks"


def task_supervisor_name(task_id: str) -> str:
    return f"{TASKS_ROOT}/{task_id}"


def task_actor_name(task_id: str) -> str:
    return f"{TASKS_ROOT}/{task_id}/actor"


class Ownership(Protocol):
    """Which tasks this node may run, and how each partition came to it (the node's held
    leases, ``supervisors/node/held_leases.py``)."""

    def owns(self, task_id: str) -> bool: ...

    def recovery_note(self, task_id: str) -> dict[str, Any] | None: ...


#: ``forward(task_id, envelope)``: send mail on to the node that owns the task.
Forward = Callable[[str, Envelope], Awaitable[None]]


class TaskSupervision:
    """Activates task actors on demand (mail, recovery) under per-task supervisors."""

    def __init__(self, system: ActorSystem, deps: TaskDeps, *,
                 scheduler: FairScheduler | None = None, ownership: Ownership | None = None,
                 forward: Forward | None = None, max_restarts: int = 3, period: float = 60.0,
                 backoff_base: float = 0.05, backoff_cap: float = 5.0):
        self.system = system
        #: What each task actor is given: ``deps`` with this supervision as its children
        #: (sessions, branches, joins) and as the hooks its actors report to.
        self.deps = replace(deps, children=self, hooks=self)
        #: The fan-out branches placed on this node's partitions (branch_host.py); a node
        #: with NATS sets its ``publish`` (mail to the other partitions' owners).
        self.branch_host = BranchHost(system, self.deps, self.owns,
                                      fenced=ownership is not None)
        self.deps = replace(self.deps, branches=self.branch_host)
        #: Admission (the node's fair scheduler): a task that gets no slot is queued and
        #: started when granted one. None: everything starts at once.
        self.scheduler = scheduler
        #: Which tasks this node may run (it holds their partition's lease). None: all.
        self.ownership = ownership
        #: Send a message on to the node that owns the task (as mail on its partition).
        self.forward = forward
        self.max_restarts = max_restarts
        self.period = period
        self.backoff = (backoff_base, backoff_cap)
        self.root: ActorRef[Supervisor] | None = None
        self._starting: set[asyncio.Task[None]] = set()

    def owns(self, task_id: str) -> bool:
        return self.ownership is None or self.ownership.owns(task_id)

    def root_spec(self) -> ChildSpec:
        def make(_: int) -> Supervisor:
            return Supervisor(self.system, "tasks", [], max_restarts=10, period=10.0)

        return ChildSpec("tasks", make, Restart.PERMANENT, shutdown_timeout=30.0)

    def _task_supervisor(self, task_id: str) -> Supervisor:
        async def escalate(cause: BaseException | None) -> None:
            if not self.owns(task_id):
                return  # the partition moved: its new owner runs the task, not us
            await fail_task(self.deps, task_id, cause, reason="restart intensity exceeded")

        actor_spec = ChildSpec(
            "actor", lambda restarts: TaskActor(task_id, self.deps, restarts), Restart.TRANSIENT,
            shutdown_timeout=30.0, significant=True,
        )
        sup = Supervisor(
            self.system, f"tasks/{task_id}", [actor_spec], max_restarts=self.max_restarts,
            period=self.period, backoff_base=self.backoff[0], backoff_cap=self.backoff[1],
            on_escalate=escalate,
        )
        sup.auto_shutdown = True
        return sup

    async def session(self, task_id: str, tenant: str, name: str) -> ActorRef[Any]:
        """The task's live tool session ``name``, started under its task supervisor."""
        ref = self.system.lookup(f"{task_supervisor_name(task_id)}/session:{name}")
        if ref is not None:
            return ref
        sup = self._live_supervisor(task_id)
        deps = self.deps

        sessions = self.branch_host.sessions

        def make(_: int) -> ToolSession:
            # Read before a call while the task's branches run on other nodes too, whose
            # calls of the session change its state there (actors/task/branch_sessions.py).
            return ToolSession(task_id, tenant, name, deps.store, deps.clock,
                               deps.registry.resources, shared=sessions.home_reads(task_id))

        started: ActorRef[Any] = await sup.ask(
            StartChild(ChildSpec(f"session:{name}", make, Restart.TRANSIENT, shutdown_timeout=5.0)),
            timeout=30.0)
        return started

    def _live_supervisor(self, task_id: str) -> ActorRef[Any]:
        sup = self.system.lookup(task_supervisor_name(task_id))
        if sup is None:
            raise RatchetError("task supervisor is not running", task_id=task_id, retryable=True)
        return sup

    async def spawn_children(self, task_id: str,
                             children: list[tuple[str, Callable[[int], Actor], float]]) -> list[Any]:
        """Start (or find) children of the task's supervisor: branch and join actors.

        Each child is ``(id, factory, shutdown_timeout)``: a branch the join no longer needs
        is given a very short one, so stopping it interrupts it instead of waiting for it.
        """
        sup = self._live_supervisor(task_id)
        specs = [ChildSpec(cid, factory, Restart.TRANSIENT, shutdown_timeout=timeout)
                 for cid, factory, timeout in children]
        refs: list[Any] = await sup.ask(StartChildren(specs), timeout=60.0)
        return refs

    def tell_task(self, task_id: str, message: Any) -> bool:
        """Tell the task's live actor (by name: it may have been restarted); False if none."""
        ref = self.system.lookup(task_actor_name(task_id))
        if ref is None:
            return False
        ref.tell(message)
        return True

    def admitted(self, task_id: str, tenant: str, priority: int = 0) -> bool:
        """Whether the task may start now: it is live already, or admission gives it a slot
        (if not, admission queues it, by ``priority`` within its tenant, and starts it
        later). A task of another node's partition is not this node's to queue: True, and
        activating it says so."""
        if self.scheduler is None or self.system.lookup(task_actor_name(task_id)) is not None:
            return True
        if not self.owns(task_id):
            return True
        return self.scheduler.admit(task_id, tenant, priority)

    async def activate(self, task_id: str, tenant: str) -> ActorRef[Any] | None:
        """Start a QUEUED or RUNNING task through admission: its live actor, or None if it
        waits for a slot (or is between restarts)."""
        if not self.admitted(task_id, tenant):
            return None
        return await self.ensure_running(task_id)

    def lookup_child(self, task_id: str, child_id: str) -> ActorRef[Any] | None:
        return self.system.lookup(f"{task_supervisor_name(task_id)}/{child_id}")

    # -- admission: the hooks task actors report to (actors/task_deps.TaskHooks) ----------

    def task_active(self, task_id: str, tenant: str) -> None:
        if self.scheduler is not None:
            self.scheduler.occupy(task_id, tenant)

    def task_stopped(self, task_id: str) -> None:
        self._release(task_id)  # its running slot goes to the next task
        self.branch_host.sessions.forget(task_id)

    def recovery_note(self, task_id: str) -> dict[str, Any] | None:
        return None if self.ownership is None else self.ownership.recovery_note(task_id)

    async def activate_or_release(self, task_id: str, tenant: str) -> None:
        """Activate a task found unfinished (recovery); one that finished or moved meanwhile
        gives its slot back."""
        try:
            await self.activate(task_id, tenant)
        except RatchetError as exc:  # finished or moved meanwhile: nothing to run here
            log.debug("not activated", task_id=task_id, error=exc.message)
            self._release(task_id)

    def forget_partitions(self, partitions: set[int]) -> None:
        """Drop these partitions' tasks from admission (queued or running here)."""
        if self.scheduler is not None:
            count = self.deps.partitions
            self.scheduler.forget(lambda t: partition_of(t, count) in partitions)
            self._start_granted(self.scheduler.grant())

    def _release(self, task_id: str) -> None:
        if self.scheduler is not None:
            self._start_granted(self.scheduler.release(task_id))

    def _start_granted(self, granted: list[tuple[str, str]]) -> None:
        """Start the tasks the scheduler just gave a running slot."""
        for task_id, _ in granted:
            task = asyncio.get_running_loop().create_task(self._start_one(task_id))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self, task_id: str) -> None:
        try:
            if await self.ensure_running(task_id) is not None:
                return
        except RatchetError as exc:  # finished, moved, or gone meanwhile
            log.debug("granted task not started", task_id=task_id, error=exc.message)
        except Exception as exc:
            log.warning("granted task not started", task_id=task_id, error=repr(exc))
        self._release(task_id)

    # -- the live tasks ---------------------------------------------------------------------

    def live_actors(self) -> list[ActorRef[Any]]:
        """The live task actors of this node."""
        return self.system.live_refs(f"{TASKS_ROOT}/", "/actor")

    def wake_all(self) -> int:
        """Tell every live task actor to go on (a task waiting at a safe point, e.g. for a
        thaw, takes its next step); returns how many were told."""
        actors = self.live_actors()
        for ref in actors:
            ref.tell(Advance())
        return len(actors)

    async def live_tasks(self) -> list[str]:
        """The task ids with a live supervisor on this node."""
        root = self.system.lookup(TASKS_ROOT)
        if root is None:
            return []
        children = await root.ask(WhichChildren(), timeout=30.0)
        return [c["id"] for c in children]

    async def stop_tasks(self, task_ids: list[str], timeout: float = 60.0) -> None:
        """Stop these tasks' supervisors (each task actor at its next safe point)."""
        root = self.system.lookup(TASKS_ROOT)
        if root is not None and task_ids:
            await root.ask(StopChildren(task_ids), timeout=timeout)

    async def stop_children(self, task_id: str, child_ids: list[str] | None) -> None:
        """Stop those children of the task's supervisor (None: all but the task actor)."""
        sup = self.system.lookup(task_supervisor_name(task_id))
        if sup is None:
            return
        if child_ids is None:
            children = await sup.ask(WhichChildren(), timeout=60.0)
            child_ids = [c["id"] for c in children if c["id"] != "actor"]
        await sup.ask(StopChildren(child_ids), timeout=60.0)

    async def ensure_running(self, task_id: str, timeout: float = 30.0, *,
                             record: TaskRecord | None = None,
                             ended_too: bool = False) -> ActorRef[Any] | None:
        """The live task actor, activating it if needed; None while it awaits a restart.

        ``record``: the task's row if the caller has just loaded it (saves reading it again).
        ``ended_too``: a task that ended is activated as well (the action sweeper: its actor
        settles what the task left unsettled, then stops).

        Raises:
            NotFound: no such task in the store (mail for it is dead-lettered, not retried).
        """
        ref = self.system.lookup(task_actor_name(task_id))
        if ref is not None:
            return ref
        if not self.owns(task_id):
            raise NotOwner("another node owns this task's partition", task_id=task_id)
        if record is None:
            record = await self.deps.store.load_task(task_id)  # NotFound: it never existed
        if is_terminal(TaskStatus(record.status)) and not ended_too:
            raise TaskFinished(f"task is {record.status}", task_id=task_id,
                               status=record.status)
        sup = self.system.lookup(task_supervisor_name(task_id))
        if sup is None:
            root = self.system.lookup(TASKS_ROOT)
            if root is None:
                return None
            spec = ChildSpec(task_id, lambda _: self._task_supervisor(task_id), Restart.TEMPORARY,
                             shutdown_timeout=60.0)
            try:
                sup = await root.ask(StartChild(spec), timeout=timeout)
            except RatchetError:
                return None
        try:
            # Answered only after the supervisor's on_start, so its children exist by now.
            await sup.ask(WhichChildren(), timeout=timeout)
        except RatchetError:
            return None  # it stopped meanwhile (the task finished)
        return self.system.lookup(task_actor_name(task_id))
