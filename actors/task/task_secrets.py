"""One task's secrets as its actor knows them: the clear values of the ``SecretStr``
objects in its input and state (opened from the store) and in the arguments of its calls.

What the task shows is cut free of them: every change it commits has its events, error,
handoff package and ledger error scrubbed (an exception's message or traceback may quote a
token it was given), and while the task runs its values are in
``protocol.redaction.LIVE``, which log lines are scrubbed with. A task without secrets
pays nothing: the scrub is skipped while the set is empty.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ratchet.persistence.ledger import ActionWrite
from ratchet.protocol.redaction import LIVE, redact, secret_values
from ratchet.protocol.secrets import Sealer

__all__ = ["TaskSecrets"]

#: The fields of a task change that are shown (events, the error, the handoff package).
_SHOWN = ("events", "error", "handoff")


class TaskSecrets:
    """The clear values of one task's secrets (see the module doc). Used in the task
    actor's own asyncio task only."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.values: set[str] = set()

    def loaded(self, sealer: Sealer, opened_before: int, *loaded: Any) -> None:
        """Take the secrets of what the actor just loaded, if the store opened any since
        ``opened_before`` (its count before the loads: no walk when nothing was sealed)."""
        if sealer.opened != opened_before:
            self.note(set().union(*(secret_values(value) for value in loaded)))

    def note(self, values: set[str]) -> None:
        """More of the task's secrets (a call's secret arguments, before the call)."""
        if values - self.values:
            self.values |= values
            LIVE.add(self.task_id, values)

    def scrub(self, change: dict[str, Any]) -> dict[str, Any]:
        """The fields of a task change (``TaskChange`` keywords) with what is shown scrubbed
        of the task's secrets; the same map when it has none."""
        if not self.values:
            return change
        out = {k: (redact(v, self.values) if k in _SHOWN and v is not None else v)
               for k, v in change.items()}
        if "events" in out:  # redact() gives lists back; a change holds (type, payload)
            out["events"] = [tuple(e) for e in out["events"]]
        if out.get("handoff") is not None:
            out["handoff"] = tuple(out["handoff"])
        action = out.get("action")
        if isinstance(action, ActionWrite) and action.error is not None:
            out["action"] = dataclasses.replace(action, error=redact(action.error, self.values))
        return out

    def release(self, running: bool) -> None:
        """The actor stops: its values leave the live set unless the task is still
        ``running`` (a crash: the restarted actor, or the supervisor failing the task, may
        still log them)."""
        if not running:
            LIVE.discard(self.task_id)
