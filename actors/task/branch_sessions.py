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
  perhaps), and so does the task's own while its branches run on other nodes too
  (:meth:`BranchSessions.shared`);
- a write that finds the version moved applies its call's changes over the fresh state.

So every call sees the changes of the calls before it, wherever they ran; calls on two
nodes at the same time are not serialized (docs/architecture.md).
"""

from __future__ import annotations

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

    def shared(self, task_id: str) -> bool:
        """Whether the task's sessions may be called from other nodes now."""
        return task_id in self.spread

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
