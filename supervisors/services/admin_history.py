"""The admin service's time-travel verbs — ``state``, ``diff`` and ``bisect`` — a mixin of
:class:`~supervisors.services.admin.AdminActor` (role viewer; like every verb
role-checked, deduplicated by command id and audited by ``AdminActor.answer``).

A task's checkpoints are numbered 1..n in the order its nodes completed (``admin history``
shows them as ``step.completed`` and the other boundary events); 0 is the state before the
first. Every state is shown with its secrets redacted, and ``bisect``'s predicate is
evaluated on the redacted state, so no predicate can probe a secret's value.
"""

from __future__ import annotations

from typing import Any

from ratchet.persistence.ports import StorePort
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import AdminCommand
from ratchet.protocol.redaction import redact
from ratchet.protocol.state_history import parse_predicate, structural_diff

__all__ = ["HistoryVerbs", "MAX_BISECT"]

#: Checkpoints ``bisect`` reads at most (each is a read of the task's values up to it).
MAX_BISECT = 5000


class HistoryVerbs:
    store: StorePort
    _task: Any  # ReadVerbs' lookup: the command's task, NOT_FOUND for another tenant's

    async def _state(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """The task's state as it was at checkpoint ``args.at`` (default: the latest)."""
        rec, names = await self._checkpoints(tenant, cmd)
        at = self._checkpoint(cmd, "at", len(names), default=len(names))
        loaded = await self.store.load_state(rec.task_id, at)
        return {"task_id": rec.task_id, "checkpoint": at, "checkpoints": len(names),
                "after_node": names[at - 1] if at else None,
                "state": redact(loaded.values)}

    async def _diff(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """What changed in the task's state from checkpoint ``args.a`` to ``args.b``."""
        rec, names = await self._checkpoints(tenant, cmd)
        a = self._checkpoint(cmd, "a", len(names))
        b = self._checkpoint(cmd, "b", len(names))
        old = redact((await self.store.load_state(rec.task_id, a)).values)
        new = redact((await self.store.load_state(rec.task_id, b)).values)
        return {"task_id": rec.task_id, "a": a, "b": b, "diff": structural_diff(old, new)}

    async def _bisect(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """The first checkpoint at which ``args.predicate`` holds, and the one before it."""
        predicate = parse_predicate(cmd.args.get("predicate"))
        rec, names = await self._checkpoints(tenant, cmd)
        for at in range(0, min(len(names), MAX_BISECT) + 1):
            state = redact((await self.store.load_state(rec.task_id, at)).values)
            if predicate.holds(state):
                return {"task_id": rec.task_id, "predicate": predicate.text, "checkpoint": at,
                        "after_node": names[at - 1] if at else None, "state": state,
                        "checked": at + 1}
        return {"task_id": rec.task_id, "predicate": predicate.text, "checkpoint": None,
                "checked": min(len(names), MAX_BISECT) + 1,
                "truncated": len(names) > MAX_BISECT}

    async def _checkpoints(self, tenant: str, cmd: AdminCommand) -> tuple[Any, list[str]]:
        rec = await self._task(tenant, cmd)  # NOT_FOUND for another tenant's task
        return rec, await self.store.checkpoint_names(rec.task_id)

    @staticmethod
    def _checkpoint(cmd: AdminCommand, name: str, last: int, default: int | None = None) -> int:
        raw = cmd.args.get(name, default)
        try:
            at = int(raw) if raw is not None and not isinstance(raw, bool) else None
        except (TypeError, ValueError):
            at = None
        if at is None or not 0 <= at <= last:
            raise InvalidMessage(f"args.{name} must be a checkpoint number, 0..{last}",
                                 field=name, checkpoints=last)
        return at
