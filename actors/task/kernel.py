"""What a task's behaviours may use of the actor that runs them: the :class:`TaskKernel`.

The task actor (``actors/task/actor.py``) runs one task; its behaviours — graph nodes,
waits, operator control, the crash-loop guard, agent nodes, fan-out — live in their own
modules and are written against this interface, not against the actor class. So they
import nothing of the actor, the actor imports them, and there is no cycle to dodge.

Every member runs in the task actor's own asyncio task: a behaviour never needs a lock.
"""

from __future__ import annotations

from typing import Any, Protocol

from ratchet.actors.core.actor import ActorRef
from ratchet.actors.effects.actions import ActionRunner
from ratchet.actors.task.deps import TaskDeps
from ratchet.actors.task.node_guard import NodeGuard
from ratchet.actors.task.open_actions import OpenActions
from ratchet.actors.task.task_secrets import TaskSecrets
from ratchet.actors.workflow.nodes import StepNode
from ratchet.actors.workflow.registry import Workflow
from ratchet.persistence.records import TaskRecord
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskStatus

__all__ = ["TaskKernel", "Events"]

#: Events a commit appends: ``(type, payload)`` in order.
Events = list[tuple[str, dict[str, Any]]]


class TaskKernel(Protocol):
    """One task as its behaviours see it: what was loaded, where it stands, and the few
    ways it may change (commit, move along an edge, go on, passivate)."""

    task_id: str
    deps: TaskDeps
    #: How many times the actor's supervisor restarted it (evidence for the crash-loop guard).
    restarts: int
    log: Any  # a structlog BoundLogger with task_id, tenant and workflow bound
    record: TaskRecord | None
    workflow: Workflow | None
    #: The task's state (the workflow's variables), as of the last commit plus this node.
    state: dict[str, Any]
    status: TaskStatus
    next_step: int
    current: str
    visits: dict[str, int]
    spent: dict[str, float]
    joins: dict[str, ActorRef[Any]]
    conversations: dict[str, Any]
    pause_requested: bool
    #: Why the task stood still before this actor loaded it (``pause``, ``approval``, ...,
    #: ``recovery``; None: it did not): its plan is re-validated once (actors/task/revalidate.py).
    revalidation: str | None
    #: Node loop detection: fingerprints of watched nodes' moves (actors/task/node_guard.py).
    node_guard: NodeGuard
    #: The writes under way and what a cancel may cut short (actors/task/open_actions.py).
    open_actions: OpenActions
    #: The clear values of the task's secrets (cut out of what it shows; agent_conversation
    #: seals the messages that quote them).
    secrets: TaskSecrets

    async def commit(self, **change: Any) -> None:
        """Commit one change (``TaskChange`` fields) under the task's current version."""

    async def move(self, node: str, to: str, events: Events, count_visit: bool = True,
                   **change: Any) -> None:
        """Commit leaving ``node`` for ``to`` along a declared edge, as a checkpoint."""

    def runner(self, step_index: int, step_timeout: float | None, *,
               task_deadline: bool = True, count_tool_calls: bool = True) -> ActionRunner:
        """The action runner (ledger, budget, deadlines) for one step's side effects."""

    async def run_step(self, step: StepNode) -> bool:
        """Run one step node; True when it committed and the task can go on."""

    async def start(self, env: Envelope) -> str:
        """Dispatch a QUEUED task on its ``task.start`` mail (a repeat is a duplicate)."""

    def advance(self) -> None:
        """Queue the next step (after this mail; other mail may come first)."""

    def passivate(self) -> None:
        """Stop the actor: the task is parked (or finished) and costs a row, not an actor."""
