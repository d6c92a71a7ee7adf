"""A sandbox fork's calls: answered without any effect at a provider.

A sandbox fork (``admin fork --sandbox``; its marks on its task row, persistence/
sandbox_rows.py) gets a :class:`SandboxRunner` instead of the plain action runner. Each call
is answered as its tool declares (``Tool.sandbox``) — the table is :func:`plan`:

==========================  =====================  ======================================
declaration                 a read                 a write
==========================  =====================  ======================================
none                        live (it is a read)    blocked
a stub ``fn(ctx, args)``    the stub answers       the stub answers
``"recorded"``              (refused at            the original's ledger answers: the
                            definition)            same key and request, SUCCEEDED, made
                                                   by the source or what it was forked
                                                   from; blocked when there is none
``"blocked"``               blocked                blocked
``"live"``                  live                   (refused at definition)
==========================  =====================  ======================================

Nothing a sandbox answers is written to the action ledger: the ledger is the tenant's
record of business actions, and a simulator's answer under a real key would later be
"reused" by a production task as if the effect had happened. What it answered is an
``action.sandboxed`` event (``answer``: ``stub``, ``recorded``, ``blocked``). A blocked call
raises :class:`~ratchet.protocol.errors.SandboxBlocked` (``ratchet.SandboxBlocked``, an
ActionFailed, PERMISSION_DENIED): the step can catch it; uncaught, the fork ends FAILED at
once with that reason — an experiment that reached a write it cannot simulate stops there,
loudly, rather than park for a human who could not do anything about it either. (An agent
node answers its model with the refusal, as it does any refused call: agent_node.py.)

Agent model calls (the read tools ``model.<node>``, session ``model``) run live, as reads;
with ``reuse_model`` a turn whose request (conversation, tools) is the one the source
recorded for the same node, visit and turn is answered from that recording, and any other
turn asks the live model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel

from ratchet.actors.effects.action_reports import coerce_result, error_of
from ratchet.actors.effects.actions import ActionRunner, CallEnv
from ratchet.actors.workflow.tools import Accepted, Tool
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import ActionFailed, SandboxBlocked

__all__ = ["Answer", "Sandbox", "SandboxRunner", "plan", "runner_for"]

Answer = Literal["live", "stub", "recorded", "blocked"]


@dataclass(frozen=True, slots=True)
class Sandbox:
    """A sandbox fork as its runner knows it (from ``TaskRecord.sandbox``)."""

    task_id: str  # the fork
    source: str  # the task it was forked from
    lineage: tuple[str, ...]  # source first, then what it was forked from, and so on
    reuse_model: bool = False

    @classmethod
    def of(cls, task_id: str, marks: dict[str, Any] | None) -> Sandbox | None:
        if not marks:
            return None
        source = str(marks["source"])
        return cls(task_id, source, tuple(marks.get("lineage") or (source,)),
                   bool(marks.get("reuse_model")))


def plan(tool: Tool[Any, Any]) -> Answer:
    """How a sandbox answers a call of ``tool`` (the table in the module's docstring)."""
    mode = tool.sandbox
    if mode is None:
        return "live" if tool.kind == "read" else "blocked"
    if callable(mode) and not isinstance(mode, str):
        return "stub"
    if mode == "live" and tool.kind == "write":  # Tool refuses it; never trust that alone
        return "blocked"
    answer: Answer = mode
    return answer


def is_model_call(tool: Tool[Any, Any]) -> bool:
    """An agent turn's model call (actors/task/agent_model_call.py ``model_tool``)."""
    return tool.session == "model" and tool.name.startswith("model.") and tool.kind == "read"


def runner_for(env: CallEnv, marks: dict[str, Any] | None) -> ActionRunner:
    """The action runner of a task: a :class:`SandboxRunner` for a sandbox fork."""
    sandbox = Sandbox.of(env.task_id, marks)
    return ActionRunner(env) if sandbox is None else SandboxRunner(env, sandbox)


class SandboxRunner(ActionRunner):
    """An :class:`ActionRunner` that makes no write and follows ``Tool.sandbox``."""

    def __init__(self, env: CallEnv, sandbox: Sandbox) -> None:
        super().__init__(env)
        self.sandbox = sandbox

    async def call(self, tool: Tool[Any, Any], args: Any, *, compensates: str | None = None) -> Any:
        if is_model_call(tool):
            if self.sandbox.reuse_model:
                recorded = await self._recorded_turn(tool, self._checked(tool, args,
                                                                         compensates))
                if recorded is not None:
                    return recorded
            return await super().call(tool, args, compensates=compensates)
        answer = plan(tool)
        if answer == "live":
            return await super().call(tool, args, compensates=compensates)
        args = self._checked(tool, args, compensates)
        key = tool.key(args) if tool.key is not None else None
        if answer == "stub":
            return await self._stub(tool, args, key)
        if answer == "recorded":
            assert key is not None  # a write: Tool requires its key
            return await self._recorded(tool, args, key)
        raise await self._blocked(tool, key, f"{tool.name} is declared blocked in a sandbox"
                                  if tool.sandbox == "blocked" else
                                  f"{tool.name} is a write with no sandbox= declaration")

    async def _stub(self, tool: Tool[Any, Any], args: BaseModel, key: str | None) -> Any:
        """The stub, run as the tool's code would be (its session, its thread if blocking,
        its timeout), never retried: a simulator that fails is the test's answer."""
        stub = tool.sandbox
        assert callable(stub)
        as_tool = replace(tool, fn=stub, sandbox=None, breaker=None, query=None,
                          compensate=None)
        ok, value = await self._invoke(as_tool, args, key, 1, "call")  # within the deadline
        if not ok:
            raise ActionFailed(f"{tool.name}: its sandbox stub failed: {value}", key=key,
                               tool=tool.name, error=error_of(value))
        if isinstance(value, Accepted):  # nothing would ever confirm it
            raise ActionFailed(f"{tool.name}: a sandbox stub answers with a result, not"
                               " Accepted", key=key, tool=tool.name)
        result = coerce_result(tool, value)
        await self._sandboxed(tool, key, "stub")
        return result

    async def _recorded(self, tool: Tool[Any, Any], args: BaseModel, key: str) -> Any:
        row = await self.env.store.get_action(self.env.tenant, key)
        if row is None or row.task_id not in self.sandbox.lineage:
            raise await self._blocked(tool, key, f"{tool.name}: the original task recorded"
                                      f" no action under key {key}")
        if row.request_hash != self._digest(tool, args):
            raise await self._blocked(tool, key, f"{tool.name}: the original task recorded"
                                      f" another request under key {key}")
        if row.status != "SUCCEEDED":
            raise await self._blocked(tool, key, f"{tool.name}: the original's action {key}"
                                      f" is {row.status}, not SUCCEEDED")
        result = coerce_result(tool, row.result)
        await self._sandboxed(tool, key, "recorded", origin=row.task_id)
        return result

    async def _recorded_turn(self, tool: Tool[Any, Any], asked: BaseModel) -> Any | None:
        """The recorded answer to this model call in the source (or what it was forked
        from), if the request is the one recorded; None: ask the live model. It is spent
        as the original spent it (tokens, cost): the fork meets its budget where it did."""
        prefix = f"model:{self.sandbox.task_id}:"
        key = str(getattr(asked, "key", ""))
        if not key.startswith(prefix):
            return None
        for origin in self.sandbox.lineage:
            row = await self.env.store.get_action(self.env.tenant,
                                                  f"model:{origin}:{key[len(prefix):]}")
            if row is None or row.status != "SUCCEEDED" or not isinstance(row.args, dict):
                continue
            if all(row.args.get(f) == getattr(asked, f, None)
                   for f in ("conversation", "messages", "tools")):
                result = coerce_result(tool, row.result)
                await self._sandboxed(tool, key, "recorded", origin=row.task_id)
                return result
        return None

    async def _blocked(self, tool: Tool[Any, Any], key: str | None, why: str) -> SandboxBlocked:
        await self._sandboxed(tool, key, "blocked", why=why)
        return SandboxBlocked(f"sandbox: {why}", tool=tool.name, key=key,
                              task_id=self.env.task_id)

    async def _sandboxed(self, tool: Tool[Any, Any], key: str | None, answer: Answer,
                         **more: Any) -> None:
        await self.env.commit(events=[(EventType.ACTION_SANDBOXED, {
            "key": key, "tool": tool.name, "answer": answer, **more})])

