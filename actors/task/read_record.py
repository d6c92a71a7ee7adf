"""Reads as the task recorded them, for replay (``actors/replay/``): a step's action runner
that, after a read's answer, notes one ``action.read`` event with the request's hash, the
arguments and the result.

Writes are recorded by the ledger already (``actors/effects/actions.py``); reads are not
ledgered (retried freely, never reconciled), so without this a replay could answer a read
only by calling the provider again. The event costs no commit of its own: it waits in the
task's :class:`~actors.task.open_actions.OpenActions` and rides in the task's next commit
(a write's, the step's checkpoint, a failure's, a suspension's). A step that crashes
before any commit loses its reads' events, and runs again. Not recorded: the model calls
of agent nodes (their answers are ledger rows of kind ``model``, written by the turn's
commit), and arguments or results holding secrets (``sealed: true``: a replay of such a
read diverges unless it may go live).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ratchet.actors.effects.actions import ActionRunner, CallEnv
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.redaction import dump_model, has_secrets

__all__ = ["RecordingRunner", "read_payload"]

#: The tool session of agent nodes' model calls (actors/task/agent_model_call.py).
MODEL_SESSION = "model"


def read_payload(tool: Tool[Any, Any], args: BaseModel, digest: str, step_index: int,
                 result: BaseModel) -> dict[str, Any]:
    """What ``action.read`` says: the tool, its arguments, the request's hash, the step
    and the result (arguments or result None, with ``sealed: true``, when their model
    declares secrets: a secret is never copied into an event)."""
    sealed = has_secrets(type(result)) or has_secrets(type(args))
    return {"tool": tool.name, "request_hash": digest, "step_index": step_index,
            "args": None if has_secrets(type(args)) else dump_model(args),
            "result": None if sealed else dump_model(result), "sealed": sealed}


class RecordingRunner(ActionRunner):
    """An :class:`ActionRunner` whose reads leave an ``action.read`` event in ``pending``
    (the task's next commit takes it)."""

    def __init__(self, env: CallEnv, pending: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__(env)
        self.pending = pending

    async def _read(self, tool: Tool[Any, Any], args: BaseModel) -> Any:
        result = await super()._read(tool, args)
        if tool.session != MODEL_SESSION:
            self.pending.append((EventType.ACTION_READ, read_payload(
                tool, args, self._digest(tool, args), self.env.step_index, result)))
        return result
