"""The admin service's schedule verbs — ``schedule-create``, ``schedule-list``,
``schedule-delete``, ``schedule-pause`` and ``schedule-resume`` — a mixin of
:class:`~supervisors.services.admin.AdminActor`. Like every verb they are role-checked,
deduplicated by command id and audited by ``AdminActor.answer``; a schedule belongs to
the tenant of the command's subject. The ticks are fired by the schedule service
(supervisors/services/schedules.py).
"""

from __future__ import annotations

from typing import Any

from ratchet.persistence.ports import StorePort
from ratchet.persistence.schedule_rows import ScheduleRow
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import CommandConflict, InvalidMessage, NotFound
from ratchet.protocol.messages import AdminCommand
from ratchet.protocol.redaction import redact
from ratchet.protocol.schedules import (
    SCHEDULE_NAME,
    parse_spec,
    spec_from_dict,
    tick_after,
)
from ratchet.supervisors.services.admin_reads import ReadVerbs
from ratchet.supervisors.supervision.tasks import TaskSupervision

__all__ = ["ScheduleVerbs"]


class ScheduleVerbs:
    store: StorePort
    clock: Clock
    tasks: TaskSupervision

    @staticmethod
    def _schedule_name(cmd: AdminCommand) -> str:
        name = cmd.args.get("name")
        if not isinstance(name, str) or not SCHEDULE_NAME.match(name):
            raise InvalidMessage(f"args.name must match {SCHEDULE_NAME.pattern}", field="name")
        return name

    async def _schedule_row(self, tenant: str, cmd: AdminCommand) -> ScheduleRow:
        name = self._schedule_name(cmd)
        row = await self.store.schedule(tenant, name)
        if row is None:
            raise NotFound("no such schedule", schedule=name)
        return row

    async def _schedule_create(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """A schedule of a workflow served here, with an input it validates; its first
        tick is the first one after now (``every``: one interval from now)."""
        name = self._schedule_name(cmd)
        workflow_name = ReadVerbs._str_arg(cmd, "workflow", required=True, max_length=128)
        assert workflow_name is not None
        version = cmd.args.get("version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise InvalidMessage("args.version must be an integer", field="version")
        workflow = self.tasks.deps.registry.get(workflow_name, version)  # UNKNOWN_WORKFLOW
        task_input = cmd.args.get("input", {})
        if not isinstance(task_input, dict):
            raise InvalidMessage("args.input must be a map", field="input")
        deadline_s = cmd.args.get("deadline_s")
        if deadline_s is not None and (isinstance(deadline_s, bool)
                                       or not isinstance(deadline_s, int | float)
                                       or deadline_s <= 0):
            raise InvalidMessage("args.deadline_s must be a number > 0", field="deadline_s")
        now = self.clock.now()
        spec = parse_spec(cmd.args, now)  # InvalidSchedule (INVALID_ARGUMENT)
        row = ScheduleRow(
            tenant=tenant, name=name, workflow=workflow.name, workflow_version=version,
            input=workflow.parse_input(task_input), spec=spec.as_dict(),
            next_at=tick_after(spec, now),
            created_by=cmd.principal.name if cmd.principal is not None else "unknown",
            created_at=now, deadline_s=float(deadline_s) if deadline_s is not None else None)
        if not await self.store.create_schedule(row):
            raise CommandConflict(f"schedule {name!r} exists; delete it first", schedule=name)
        return {"schedule": row.shown(redact)}

    async def _schedule_list(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        return {"schedules": [row.shown(redact) for row in await self.store.schedules(tenant)]}

    async def _schedule_delete(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Remove the schedule; tasks it submitted are left as they are."""
        name = self._schedule_name(cmd)
        if not await self.store.delete_schedule(tenant, name):
            raise NotFound("no such schedule", schedule=name)
        return {"deleted": name}

    async def _schedule_pause(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        row = await self._schedule_row(tenant, cmd)
        await self.store.pause_schedule(tenant, row.name, True, row.next_at, self.clock.now())
        return {"schedule": row.name, "paused": True}

    async def _schedule_resume(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Ticks that fell while it was paused are not run: it goes on from the next one."""
        row = await self._schedule_row(tenant, cmd)
        now = self.clock.now()
        next_at = tick_after(spec_from_dict(row.spec), now) if row.paused else row.next_at
        await self.store.pause_schedule(tenant, row.name, False, next_at, now)
        return {"schedule": row.name, "paused": False, "next_at": next_at}
