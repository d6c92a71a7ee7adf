"""The tool sessions of fan-out branches a node runs for a task of another node.

A task's tool sessions are actors under its supervisor, on its node
(supervisors/supervision/tasks.py). A branch placed on another node's partition
(branch_host.py) calls its in-process tools there, through the same path as any call
(``ToolCalls`` → the node's local worker → a session actor), so that node serves the
session too: :class:`BranchSessions` keeps one session actor per (task, session) for the
branches it runs, named ``branches/<task_id>/session:<name>/…``, stopped when the node's
last branch of the task ends. Both ends share the state through the store, written under
its version (actors/effects/session_state.py):

- a session served here reads the state before each call (another node changed it,
  perhaps), and so does the task's own while its branches run on other nodes too, and
  once after (:meth:`BranchSessions.home_reads`);
- a write that finds the version moved applies its call's changes over the fresh state.

So every call sees the changes of the calls before it, wherever they ran; calls on two
nodes at the same time are not serialized (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ratchet.actors.core.actor import ActorRef, ActorSystem
from ratchet.actors.effects.tool_session import ToolSession
from ratchet.actors.task.deps import TaskDeps
from ratchet.protocol.ids import new_id

__all__ = ["BranchSessions"]


class BranchSessions:
    """The session actors of the branches a node runs for other nodes' tasks, and which of
    this node's tasks have branches elsewhere (module doc)."""

    def __init__(self, system: ActorSystem, deps: TaskDeps) -> None:
        self.system, self.deps = system, deps
        self.refs: dict[tuple[str, str], ActorRef[Any]] = {}
        #: Tasks run here whose fan-out visit has branches placed on other nodes.
        self.spread: set[str] = set()
        #: Per task, when it last spread (a count of this node's spreads: never reused, so
        #: a forgotten task's sessions read once more, never once less).
        self._spreads: dict[str, int] = {}
        self._count = 0

    def spread_to_others(self, task_id: str) -> None:
        """The task's visit has branches on other nodes now (they may call its sessions)."""
        if task_id not in self.spread:
            self.spread.add(task_id)
            self._count += 1
            self._spreads[task_id] = self._count

    def forget(self, task_id: str) -> None:
        """The task's actor stopped here (its sessions with it)."""
        self.spread.discard(task_id)
        self._spreads.pop(task_id, None)

    def home_reads(self, task_id: str) -> Callable[[], bool]:
        """For the task's own session actor: whether to read the state before a call —
        while the task's branches run on other nodes, and once after each time they did
        (their last changes may have come after this session's last call)."""
        seen = self._spreads.get(task_id, 0)

        def stale() -> bool:
            nonlocal seen
            if task_id in self.spread:
                seen = -1  # read now, and once more after the visit
                return True
            spreads = self._spreads.get(task_id, 0)
            if spreads != seen:
                seen = spreads
                return True
            return False

        return stale

    async def session(self, task_id: str, tenant: str, name: str) -> ActorRef[Any]:
        """The session ``name`` of the task, for a branch running here: the task's own when
        the task runs here, else one of this node's."""
        children = self.deps.children
        if children.lookup_child(task_id, "actor") is not None:
            home: ActorRef[Any] = await children.session(task_id, tenant, name)
            return home
        ref = self.refs.get((task_id, name))
        if ref is None or not ref.is_alive:
            deps = self.deps
            actor = ToolSession(task_id, tenant, name, deps.store, deps.clock,
                                deps.registry.resources, shared=lambda: True)
            ref = self.system.spawn(actor, f"branches/{task_id}/session:{name}/{new_id('s')}")
            self.refs[(task_id, name)] = ref
        return ref

    def release(self, task_id: str) -> None:
        """No branch of the task runs here any more: its sessions here stop (a call still
        queued in one raises ``ActorStopped``; the state is in the store)."""
        for key in [k for k in self.refs if k[0] == task_id]:
            self.refs.pop(key).stop()
