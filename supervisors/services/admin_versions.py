"""The admin service's verbs about workflow versions — ``migrate`` (role operator) and
``versions`` (role viewer) — a mixin of :class:`~supervisors.services.admin.AdminActor`.
Like every verb they are role-checked, deduplicated by command id and audited (requested,
then the outcome) by ``AdminActor.answer``; a task of another tenant is NOT_FOUND.

``migrate`` moves a task that stands still — PAUSED (``definition_changed`` among other
reasons), or parked on an approval, an external wait or a sleep — to another registered
version of its workflow, through the migration function that version declares
(actors/workflow/migrations.py). Everything is checked first (the status, the target
version, no live actor, what the function returns, that the state can be checkpointed);
then one transaction (persistence/version_rows.py) writes the task's version, definition
hash and node, a checkpoint of the migrated state and ``task.migrated``, compare-and-set on
the task's version. A refusal writes nothing but its audit entry. The task keeps its
status: a parked one goes on under the new version when its approval, message or timer
comes; a PAUSED one when an operator resumes it.
"""

from __future__ import annotations

from typing import Any

import structlog

from ratchet.actors.core.actor import ActorSystem
from ratchet.actors.task.definition_guard import REASON as DEFINITION_CHANGED
from ratchet.actors.workflow.migrations import PARKED_KINDS, migrate_state
from ratchet.persistence.checkpoints import StateTracker
from ratchet.persistence.ports import StorePort
from ratchet.persistence.txn_events import CheckpointWrite
from ratchet.persistence.txns import TaskChange
from ratchet.persistence.version_rows import TaskMigration
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import (
    IllegalTransition,
    InvalidMessage,
    MigrationRefused,
    RatchetError,
    Unavailable,
)
from ratchet.protocol.messages import AdminCommand
from ratchet.supervisors.supervision.tasks import TaskSupervision, task_actor_name

__all__ = ["MIGRATABLE", "MIGRATION_STEP", "VersionVerbs"]

log = structlog.get_logger("ratchet.admin")

#: The statuses a task may be migrated in: it stands still at a known node.
MIGRATABLE = ("PAUSED", *PARKED_KINDS)
#: The checkpoint a migration writes is named after this pseudo-node (``admin state``).
MIGRATION_STEP = "@migrate"


class VersionVerbs:
    store: StorePort
    tasks: TaskSupervision
    system: ActorSystem
    clock: Clock
    node_id: str
    _task: Any  # ReadVerbs' lookup: the command's task, NOT_FOUND for another tenant's
    _int_arg: Any  # ReadVerbs'

    @staticmethod
    def _who(cmd: AdminCommand) -> str:
        raise NotImplementedError  # AdminActor's

    def _check_version(self, rec: Any, cmd: AdminCommand) -> None:
        raise NotImplementedError  # AdminActor's

    async def _migrate(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Move the task to version ``args.to_version`` (module doc)."""
        rec = await self._task(tenant, cmd)
        self._check_version(rec, cmd)
        if cmd.args.get("to_version") is None:
            raise InvalidMessage("migrate needs args.to_version (--to-version N)",
                                 field="to_version")
        to_version = self._int_arg(cmd, "to_version", 0, low=1)
        if rec.status not in MIGRATABLE:
            raise IllegalTransition(f"cannot migrate a {rec.status} task: pause it first, or"
                                    " wait until it is parked", status=rec.status)
        registry = self.tasks.deps.registry
        target = registry.get(rec.workflow, to_version)  # UnknownWorkflow: not registered
        if to_version == rec.workflow_version:
            raise MigrationRefused(
                f"the task is on v{to_version} already (a changed definition of it: resume"
                " with accept_definition=true)", reason="same_version")
        if self.system.lookup(task_actor_name(rec.task_id)) is not None:
            raise Unavailable("the task's actor is live (it is between two states); retry",
                              task_id=rec.task_id)
        loaded = await self.store.load_state(rec.task_id)
        node = rec.current_node or self._start_of(rec, target)
        migrated = await migrate_state(target, rec.workflow_version, loaded.values, node,
                                       rec.status)
        deps = self.tasks.deps
        delta = StateTracker(loaded.encoded, blobs=loaded.blobs, values=loaded.values,
                             max_value_bytes=deps.max_value_bytes,
                             max_checkpoint_bytes=deps.max_checkpoint_bytes,
                             default=self.store.secrets.default).diff(migrated.state)
        new_hash = registry.definition_hash(rec.workflow, to_version)
        assert new_hash is not None  # registered: it has one
        payload = {"by": self._who(cmd), "command_id": cmd.command_id,
                   "from_version": rec.workflow_version, "to_version": to_version,
                   "from_node": node, "to_node": migrated.node,
                   "from_definition": rec.definition_hash, "to_definition": new_hash,
                   "changed": sorted(v.key for v in delta.values)}
        now = self.clock.now()
        result = await self.store.migrate_task(TaskMigration(TaskChange(
            task_id=rec.task_id, expected_version=rec.version, producer=self.node_id, now=now,
            events=[(EventType.TASK_MIGRATED, payload)], definition_hash=new_hash,
            control=self._control_after(rec.control),
            checkpoint=CheckpointWrite(rec.next_step, MIGRATION_STEP, rec.next_step, delta,
                                       next_node=migrated.node)), to_version))
        log.info("task migrated", task_id=rec.task_id, correlation_id=cmd.command_id,
                 workflow=rec.workflow, from_version=rec.workflow_version,
                 to_version=to_version, to_node=migrated.node)
        return {"task_id": rec.task_id, "workflow": rec.workflow, **{
            k: payload[k] for k in ("from_version", "to_version", "from_node", "to_node",
                                    "to_definition", "changed")},
                "status": rec.status, "checkpoint": result.last_checkpoint,
                "then": "admin resume" if rec.status == "PAUSED"
                else "goes on under the new version when what it waits for comes"}

    @staticmethod
    def _control_after(control: dict[str, Any]) -> dict[str, Any] | None:
        """The task's pending requests after the migration: a pause the runtime asked for
        because of a changed definition is moot (the task is on a registered one now)."""
        if control.get("pause", {}).get("reason") != DEFINITION_CHANGED:
            return None  # unchanged
        return {k: v for k, v in control.items() if k != "pause"}

    def _start_of(self, rec: Any, target: Any) -> str:
        """Where a task that has not run a node yet stands: its own version's start."""
        try:
            return str(self.tasks.deps.registry.get(rec.workflow, rec.workflow_version).start)
        except RatchetError:
            return str(target.start)

    async def _versions(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Per workflow, each version registered on this node (its definition hash, whether
        it is the default for new tasks) and the tenant's tasks on it by status; tasks on a
        version with another definition than the registered one, or on a version not
        registered here, are listed apart."""
        registry = self.tasks.deps.registry
        rows = await self.store.version_counts(tenant)
        names = sorted(set(registry.names()) | {r["workflow"] for r in rows})
        out = []
        for name in names:
            registered = registry.versions(name)
            versions: dict[int, dict[str, Any]] = {
                v: _version_entry(v, registry.definition_hash(name, v), v == registered[-1])
                for v in registered}
            for r in (r for r in rows if r["workflow"] == name):
                entry = versions.setdefault(r["version"], _version_entry(r["version"]))
                _count(entry["tasks"], r["status"], r["count"])
                known = entry["definition_hash"]
                if known is not None and r["definition_hash"] not in (None, known):
                    _count(entry["other_definitions"], r["definition_hash"], r["count"])
            out.append({"workflow": name, "versions": [
                {**v, "total": sum(v["tasks"].values())} for _, v in sorted(versions.items())]})
        return {"tenant": tenant, "node_id": self.node_id, "workflows": out}


def _version_entry(version: int, definition_hash: str | None = None,
                   default: bool = False) -> dict[str, Any]:
    """One version's line of ``versions``; no hash: not registered on this node."""
    return {"version": version, "registered": definition_hash is not None, "default": default,
            "definition_hash": definition_hash, "tasks": {}, "other_definitions": {}}


def _count(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n
