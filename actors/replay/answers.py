"""Tool and model calls answered from the recording, never from the outside world.

A replayed step gets a :class:`ReplayRunner` where the live one has an ``ActionRunner``:

- a **write** is looked up in the action ledger by its idempotency key: the same request
  (hash of its sealed form, as the ledger keeps it) gets the recorded result (or the
  recorded failure); another request under the key, or a key the ledger does not hold, is
  a divergence, and the call is never made;
- a **read** is matched with the step's ``action.read`` events (actors/task/read_record.py)
  by tool and request hash; one with no recorded match is a divergence, and goes live only
  when the replay was asked for ``live_reads`` (the tool's own function, in process);
- an agent's **model call** is looked up by its turn key (``model:<task>:<node>:<visit>:
  <turn>``): the same request digest gets the recorded answer; another is a divergence
  carrying the diff of the conversation's messages.

A divergence is recorded, then raised as :class:`ReplayDivergence`, which ends the step.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from ratchet.actors.effects.action_reports import coerce_args, coerce_result
from ratchet.actors.replay.report import Divergence
from ratchet.actors.task.read_record import MODEL_SESSION
from ratchet.actors.workflow.tools import Tool, ToolContext
from ratchet.persistence.ledger import ActionRecord
from ratchet.protocol.codec import canonical
from ratchet.protocol.errors import ActionFailed, ErrorCode
from ratchet.protocol.ids import request_hash
from ratchet.protocol.redaction import dump_model, redact
from ratchet.protocol.secrets import Sealer
from ratchet.protocol.state_history import structural_diff

__all__ = ["Answers", "ReplayDivergence", "ReplayRunner"]


class ReplayDivergence(Exception):
    """A call the recording cannot answer: the step ends here (already in the report)."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(f"{divergence.kind} at {divergence.step}")
        self.divergence = divergence


class Answers:
    """What the recording answers with, for one task: the ledger by key, the reads by step.
    ``live_reads``: a read with no recorded answer may call the tool's function."""

    def __init__(self, ledger: list[ActionRecord], reads: list[dict[str, Any]], sealer: Sealer,
                 resources: dict[str, Any], *, task_id: str, tenant: str,
                 live_reads: bool = False) -> None:
        self.by_key = {a.key: a for a in ledger}
        self.writes = [a for a in ledger if a.kind not in ("read", "model")]
        self.reads: dict[int, list[dict[str, Any]]] = {}
        for r in reads:
            self.reads.setdefault(int(r.get("step_index", -1)), []).append(r)
        self.sealer, self.resources = sealer, resources
        self.task_id, self.tenant, self.live_reads = task_id, tenant, live_reads
        self.answered = 0
        self.went_live = 0
        self.used: set[int] = set()  # ids of the recorded rows and reads already answered

    def digest(self, tool: Tool[Any, Any], args: BaseModel) -> str:
        return request_hash(self.sealer.canonical({"tool": tool.name, "args": dump_model(args)}))


class ReplayRunner:
    """The action runner of one replayed step (the interface steps and agents call)."""

    def __init__(self, answers: Answers, step: str, checkpoint: int, step_index: int,
                 divergences: list[Divergence],
                 messages: Callable[[], list[dict[str, Any]]] | None = None,
                 recorded_messages: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.a, self.step, self.checkpoint, self.step_index = answers, step, checkpoint, step_index
        self.divergences = divergences
        self.messages, self.recorded_messages = messages, recorded_messages

    def _diverge(self, kind: str, **detail: Any) -> ReplayDivergence:
        d = Divergence(kind, self.step, self.checkpoint, detail)
        self.divergences.append(d)
        return ReplayDivergence(d)

    async def call(self, tool: Tool[Any, Any], args: Any, *, compensates: str | None = None) -> Any:
        args = coerce_args(tool, args)
        if tool.session == MODEL_SESSION:
            return self._model(tool, args)
        if tool.kind == "read":
            return await self._read(tool, args)
        return self._write(tool, args)

    async def query_once(self, tool: Tool[Any, Any], args: BaseModel, key: str) -> tuple[bool, Any]:
        raise self._diverge("unrecorded", tool=tool.name, key=key, op="query",
                            why="a replay never queries a provider")

    # -- writes ------------------------------------------------------------------------------

    def _write(self, tool: Tool[Any, Any], args: BaseModel) -> Any:
        key = tool.key(args) if tool.key is not None else None
        row = self.a.by_key.get(key) if key is not None else None
        data = dump_model(args)
        if row is None or row.task_id != self.a.task_id:
            like = next((w for w in self.a.writes if w.tool == tool.name and id(w) not in
                         self.a.used and w.step_index == self.step_index), None)
            if like is None:
                raise self._diverge("unrecorded", tool=tool.name, key=key, op="write",
                                    args=redact(data), why="no recorded call: a write is"
                                    " never made by a replay")
            self.a.used.add(id(like))
            raise self._diverge("tool_request", tool=tool.name, recorded_key=like.key, key=key,
                                fields=_fields(like.args, data))
        if row.request_hash != self.a.digest(tool, args):
            raise self._diverge("tool_request", tool=tool.name, key=key,
                                fields=_fields(row.args, data))
        self.a.used.add(id(row))
        self.a.answered += 1
        if row.status in ("SUCCEEDED", "COMPENSATED") and row.result is not None:
            return coerce_result(tool, row.result)
        if row.status == "FAILED":
            failure = ActionFailed(f"{tool.name} failed before: "
                                   f"{(row.error or {}).get('message')}", key=key,
                                   tool=tool.name, error=row.error)
            code = str((row.error or {}).get("code"))
            if code in ErrorCode.__members__:
                failure.code = ErrorCode(code)
            raise failure
        raise self._diverge("unrecorded", tool=tool.name, key=key, op="write",
                            status=row.status, why="the recording holds no outcome for it")

    # -- reads -------------------------------------------------------------------------------

    async def _read(self, tool: Tool[Any, Any], args: BaseModel) -> Any:
        digest = self.a.digest(tool, args)
        pool = [r for r in self.a.reads.get(self.step_index, ()) if id(r) not in self.a.used
                and r.get("tool") == tool.name]
        hit = next((r for r in pool if r.get("request_hash") == digest
                    and not r.get("sealed")), None)
        if hit is not None:
            self.a.used.add(id(hit))
            self.a.answered += 1
            return coerce_result(tool, hit["result"])
        if self.a.live_reads:
            self.a.went_live += 1
            return coerce_result(tool, await self._live(tool, args))
        if pool:
            self.a.used.add(id(pool[0]))
            raise self._diverge("tool_request", tool=tool.name, op="read",
                                fields=_fields(pool[0].get("args"), dump_model(args)))
        raise self._diverge("unrecorded", tool=tool.name, op="read", args=redact(
            dump_model(args)), why="no recorded answer (replay with live reads to call it)")

    async def _live(self, tool: Tool[Any, Any], args: BaseModel) -> Any:
        ctx = ToolContext(task_id=self.a.task_id, tenant=self.a.tenant, tool=tool.name, key=None,
                          attempt=1, session={}, resources=self.a.resources)
        if inspect.iscoroutinefunction(tool.fn):
            return await tool.fn(ctx, args)
        return await asyncio.to_thread(tool.fn, ctx, args)

    # -- model calls -------------------------------------------------------------------------

    def _model(self, tool: Tool[Any, Any], args: BaseModel) -> Any:
        asked = args.model_dump()
        key = asked.get("key")
        row = self.a.by_key.get(key) if isinstance(key, str) else None
        if row is None or row.task_id != self.a.task_id:
            raise self._diverge("model_request", tool=tool.name, key=key,
                                why="no recorded turn answers this call")
        recorded = row.args if isinstance(row.args, dict) else {}
        # ``model`` is ``name:version``, and the version is what the provider last reported
        # (an OpenAI-compatible model learns it from its first answer): not the code's
        # choice. The same model name with another version is the same request.
        name = str(asked.get("model", "")).split(":", 1)[0]
        if str(recorded.get("model", "")).split(":", 1)[0] == name:
            asked = {**asked, "model": recorded.get("model")}
        if row.request_hash == request_hash(canonical(asked)):
            self.a.used.add(id(row))
            self.a.answered += 1
            return coerce_result(tool, row.result)
        detail: dict[str, Any] = {"tool": tool.name, "key": key,
                                  "fields": _fields(recorded, asked)}
        if self.messages is not None and self.recorded_messages is not None:
            before = self.recorded_messages()[:int(recorded.get("messages", 0) or 0)]
            detail["messages"] = structural_diff(before, self.messages())
        raise self._diverge("model_request", **detail)


def _fields(recorded: Any, replayed: Any) -> dict[str, Any]:
    """Which arguments differ: ``{path: [recorded, replayed]}`` (absent: None), secrets
    redacted."""
    if recorded is None:
        return {"(recorded arguments not kept)": [None, redact(replayed)]}
    diff = structural_diff(redact(recorded), redact(replayed))
    out: dict[str, Any] = {p: [None, v] for p, v in diff["added"]}
    out.update({p: [v, None] for p, v in diff["removed"]})
    out.update({p: [a, b] for p, a, b in diff["changed"]})
    return out

