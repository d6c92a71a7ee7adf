"""The task as a replayed node sees it: a :class:`~actors.task.kernel.TaskKernel` with no
store, no bus and no actor behind it.

Agent nodes are replayed by the runtime's own code (``actors/task/agent_node.py``'s
``run_agent``) against this kernel: ``move`` and ``commit`` only note what the node would
have committed, ``runner`` gives the :class:`~actors.replay.answers.ReplayRunner`, and the
store it sees (:class:`ReplayStore`) holds nothing — a conversation is rebuilt from the
node's code (system message, prompt), which is how a changed prompt shows.

Time comes from the recording (:class:`ReplayClock`: the wall time of the checkpoint before
the node; a sleep moves it at once), ids (task, tenant, step index) from the task row.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, cast

import structlog

from ratchet.actors.core.actor import ActorRef
from ratchet.actors.replay.answers import Answers, ReplayRunner
from ratchet.actors.replay.report import Divergence
from ratchet.actors.task.deps import TaskDeps
from ratchet.actors.task.node_guard import NodeGuard
from ratchet.actors.task.open_actions import OpenActions
from ratchet.actors.task.task_secrets import TaskSecrets
from ratchet.actors.workflow.nodes import StepNode
from ratchet.actors.workflow.registry import Registry, Workflow
from ratchet.persistence.ledger import ActionRecord
from ratchet.persistence.records import TaskRecord
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.messages import Envelope
from ratchet.protocol.secrets import Sealer
from ratchet.protocol.states import TaskStatus

__all__ = ["ReplayClock", "ReplayEnded", "ReplayKernel", "ReplayStore"]


class ReplayClock:
    """The recorded time: ``now`` is where the replay put it; a sleep moves it at once."""

    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at

    def due_now(self) -> float:
        return self.at

    async def sleep(self, seconds: float) -> None:
        self.at += max(0.0, seconds)


class ReplayEnded(Exception):
    """The replayed node ended the task (failed, suspended): what it committed."""

    def __init__(self, change: dict[str, Any]) -> None:
        super().__init__(str(change.get("status_event") or "suspended"))
        self.change = change


class ReplayStore:
    """The few store reads agent code makes, answered with nothing recorded (a replay
    rebuilds what it needs from the code and the recording)."""

    def __init__(self, sealer: Sealer) -> None:
        self.secrets = sealer

    async def agent_log(self, task_id: str, node: str) -> list[tuple[str, dict[str, Any]]]:
        return []

    async def task_actions(self, task_id: str) -> list[ActionRecord]:
        return []

    async def get_action(self, tenant: str, key: str) -> ActionRecord | None:
        return None


class ReplayKernel:
    """One recorded task, replayed node by node (see the module doc)."""

    restarts = 0
    pause_requested = False
    revalidation: str | None = None

    def __init__(self, record: TaskRecord, workflow: Workflow, registry: Registry,
                 sealer: Sealer, answers: Answers, clock: ReplayClock) -> None:
        self.task_id = record.task_id
        self.record: TaskRecord | None = record
        self.workflow: Workflow | None = workflow
        self.answers = answers
        self.deps = TaskDeps(store=cast(Any, ReplayStore(sealer)), registry=registry,
                             clock=clock, producer="replay", rng=random.Random(0))
        self.log = structlog.get_logger("ratchet.replay").bind(
            task_id=record.task_id, tenant=record.tenant, workflow=record.workflow, replay=True)
        self.state: dict[str, Any] = {}
        self.status = TaskStatus.RUNNING
        self.next_step = 0
        self.current = workflow.start
        self.visits: dict[str, int] = {}
        self.spent: dict[str, float] = {}
        self.joins: dict[str, ActorRef[Any]] = {}
        self.conversations: dict[str, Any] = {}
        self.node_guard = NodeGuard()
        self.open_actions = OpenActions()
        self.secrets = TaskSecrets(record.task_id)
        # Set for each replayed node by the engine (actors/replay/engine.py):
        self.checkpoint = 0
        self.divergences: list[Divergence] = []
        self.messages: Callable[[], list[dict[str, Any]]] | None = None
        self.recorded_messages: Callable[[], list[dict[str, Any]]] | None = None
        self.moved: str | None = None

    def begin(self, checkpoint: int, step_index: int, node: str, state: dict[str, Any],
              at: float) -> None:
        """Stand where the recording stood before ``checkpoint``: its state, its time."""
        self.checkpoint, self.next_step, self.current = checkpoint, step_index, node
        self.state.clear()
        self.state.update(state)  # the same dict: a conversation holds on to it
        cast(ReplayClock, self.deps.clock).at = at
        self.divergences = []
        self.moved = None

    async def commit(self, **change: Any) -> None:
        if change.get("status_event") is not None:
            raise ReplayEnded(change)

    async def move(self, node: str, to: str, events: list[tuple[str, dict[str, Any]]],
                   count_visit: bool = True, **change: Any) -> None:
        self.moved = to

    def runner(self, step_index: int, step_timeout: float | None, *,
               task_deadline: bool = True, count_tool_calls: bool = True) -> Any:
        return ReplayRunner(self.answers, self.current, self.checkpoint, step_index,
                            self.divergences, self.messages, self.recorded_messages)

    async def run_step(self, step: StepNode) -> bool:
        raise RatchetError("replay runs steps itself (actors/replay/engine.py)")

    async def start(self, env: Envelope) -> str:
        return "replay"

    def advance(self) -> None:
        """Nothing queued: the engine walks the recorded checkpoints."""

    def passivate(self) -> None:
        """Nothing to stop: no actor runs a replay."""
