"""The admin service's ``diagnose`` verb (role viewer): why a task is where it is — a mixin
of :class:`~supervisors.services.admin.AdminActor`.

The rows come from the store (persistence/diagnose_rows.py: bounded reads by the task's
indexes), the report and its verdict from actors/task/diagnosis.py (pure). A command about a
task is answered by the node that owns the task's partition (``AdminActor.answer`` forwards
it), so ``live`` says whether the task has an actor running there; like every verb it is
role-checked, deduplicated by command id and audited by ``AdminActor.answer``.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.task.diagnosis import diagnose
from ratchet.protocol.messages import AdminCommand
from ratchet.protocol.subjects import partition_of
from ratchet.supervisors.services.admin_reads import ReadVerbs
from ratchet.supervisors.supervision.tasks import task_actor_name

__all__ = ["DiagnoseVerbs"]


class DiagnoseVerbs(ReadVerbs):
    """``diagnose``."""

    async def _diagnose(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        rec = await self._task(tenant, cmd)
        partition = (partition_of(rec.task_id, self.leases.partitions)
                     if self.leases is not None else None)
        rows = await self.store.diagnosis_rows(rec.task_id, partition)
        if rows["lease"] is None:  # one node owns every partition: this one
            rows["lease"] = {"partition": None, "owner": self.node_id}
        report = diagnose(rec, rows, self.clock.now())
        live = self.system.lookup(task_actor_name(rec.task_id)) is not None
        return {**report, "answered_by": self.node_id, "live": live}
