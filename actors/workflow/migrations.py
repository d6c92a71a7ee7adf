"""Migrations between versions of one workflow: how a task started on an older version is
moved to a newer one (``ratchet admin migrate TASK --to-version N``, docs/workflows.md,
"Migrating a task to another version").

The newer version declares, for each older version it accepts tasks from, a function of
the task's state and the node it stands at, returning the state and node it goes on with
under the newer version:

    wf2 = ratchet.Workflow("spend", version=2)
    ...

    @wf2.migrate_from(1)
    def from_v1(state: dict, node: str) -> tuple[dict, str]:
        return {**state, "currency": "EUR"}, node

The function must be pure (it may run again, for a repeated or a refused command) and
fast; it runs in the admin service, never concurrently with the task. What it returns is
checked before anything is written (:func:`migrate_state`): a map with string keys, and a
node of the newer version's graph — for a task parked on an approval, an external wait or
a sleep, the very node it waits at (same name, same kind), since the approval, the wait
and the timer are bound to it. Anything else refuses the migration with
:class:`~protocol.errors.MigrationRefused`, and nothing changes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ratchet.actors.workflow.nodes import Node
from ratchet.protocol.errors import MigrationRefused, WorkflowDefinitionError

__all__ = ["MigrateFn", "MigrationBuilder", "Migrated", "migrate_state", "PARKED_KINDS"]

#: ``(state, node) -> (new_state, new_node)``; may be ``async``.
MigrateFn = Callable[[dict[str, Any], str], Any]

#: The node kind a parked task stands at, by its status: the migration keeps it there.
PARKED_KINDS = {"WAITING_APPROVAL": ("approval",), "WAITING_EXTERNAL": ("wait", "step"),
                "SLEEPING": ("sleep",)}


class MigrationBuilder:
    """``Workflow.migrate_from``, mixed into the workflow class."""

    name: str
    version: int
    _migrations: dict[int, MigrateFn] | None = None

    @property
    def migrations(self) -> Mapping[int, MigrateFn]:
        """The declared migrations, by the version they take tasks from."""
        return MappingProxyType(self._migrations or {})

    def migrate_from(self, version: int) -> Callable[[MigrateFn], MigrateFn]:
        """Decorator declaring how a task of ``version`` becomes a task of this version.

        Raises:
            WorkflowDefinitionError: ``version`` is not an earlier version, or is declared
                twice, or the function does not take (state, node).
        """
        where = f"workflow {self.name} v{self.version}"
        if isinstance(version, bool) or not isinstance(version, int) \
                or not 1 <= version < self.version:
            raise WorkflowDefinitionError(
                f"{where}: migrate_from({version!r}) must name an earlier version (1..."
                f"{self.version - 1})")
        if version in (self._migrations or {}):
            raise WorkflowDefinitionError(f"{where}: two migrations from v{version}")

        def add(fn: MigrateFn) -> MigrateFn:
            try:
                inspect.signature(fn).bind({}, "node")
            except (TypeError, ValueError):
                raise WorkflowDefinitionError(
                    f"{where}: the migration from v{version} must take (state, node)") from None
            self._migrations = {**(self._migrations or {}), version: fn}
            return fn

        return add


@dataclass(frozen=True, slots=True)
class Migrated:
    """What a migration returned, checked."""

    state: dict[str, Any]
    node: str


async def migrate_state(target: Any, from_version: int, state: dict[str, Any], node: str,
                        status: str) -> Migrated:
    """Run ``target``'s migration from ``from_version`` on a task at ``node`` (its status
    ``status``) and check what it returns (module doc).

    Raises:
        MigrationRefused: no migration declared, the function raised, or what it returned
            is not a map and a node of ``target`` the task may stand at.
    """
    where = f"workflow {target.name} v{target.version}"
    fn = target.migrations.get(from_version)
    if fn is None:
        raise MigrationRefused(f"{where} declares no migration from v{from_version}"
                               f" (@wf.migrate_from({from_version}))", reason="undeclared")
    try:
        out = fn(dict(state), node)
        if inspect.isawaitable(out):
            out = await out
    except Exception as exc:  # the user's code: its failure is the refusal's reason
        raise MigrationRefused(f"the migration from v{from_version} raised: {exc!r}"[:500],
                               reason="raised") from None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise MigrationRefused(f"the migration from v{from_version} must return"
                               f" (state, node), not {type(out).__name__}", reason="shape")
    new_state, new_node = out
    if not isinstance(new_state, dict) or not all(isinstance(k, str) for k in new_state):
        raise MigrationRefused("the migrated state must be a map with string keys",
                               reason="state")
    if not isinstance(new_node, str) or new_node not in target.nodes:
        raise MigrationRefused(f"the migration maps node {node!r} to {new_node!r}, which is"
                               f" not a node of {where}", reason="unknown_node",
                               node=str(new_node)[:200], known=sorted(target.nodes)[:50])
    _check_parked(target.nodes[new_node], node, status, where)
    return Migrated(new_state, new_node)


def _check_parked(new: Node, node: str, status: str, where: str) -> None:
    kinds = PARKED_KINDS.get(status)
    if kinds is None:
        return  # PAUSED: it goes on from any node when resumed
    if new.name != node or new.kind not in kinds:
        raise MigrationRefused(
            f"a {status} task waits at {node!r}: the migration must keep it at a node of that"
            f" name and kind in {where} (got {new.name!r}, a {new.kind})",
            reason="parked_node", node=new.name)
