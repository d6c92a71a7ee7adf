"""An agent node's conversation: its messages, its turn records (for the loop detectors)
and the tool results it has seen, kept in memory by the task actor, appended to the agent
log in each turn's own transaction, and read back from the log after a restart.

A message that quotes one of the task's secrets (a prompt built with ``get_secret_value()``,
a model echoing it) is kept sealed in the agent log — the whole message, as one sealed
``{"sealed": SecretStr(json)}`` — and opened when the log is read back; the model itself
gets it as it was. Used by ``actors/task/agent_node.py``, which runs the turns.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import SecretStr

from ratchet.actors.agents.compaction import summary_message
from ratchet.actors.agents.loop_detect import TurnRecord
from ratchet.actors.agents.models import Message
from ratchet.actors.task.kernel import TaskKernel

__all__ = ["Conversation", "digest"]


def digest(value: Any) -> str:
    """A short, stable digest of a JSON-like value (messages, tool results, schemas)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Conversation:
    """An agent node's messages and turn records: kept in memory by the task actor, appended
    to the agent log in the turn's own transaction, read back from it after a restart."""

    def __init__(self, actor: TaskKernel, scope: str, log: list[tuple[str, dict[str, Any]]]):
        self.state = actor.state
        self.secrets, self.sealer = actor.secrets, actor.deps.store.secrets
        self.p = f"agent.{scope}."
        self.node = scope
        # Kept as Message objects, so a turn does not rebuild the whole conversation.
        self.messages: list[Message] = []
        self.hash = ""
        log = [(k, _opened(b)) for k, b in log]
        #: The latest compaction (actors/agents/compaction.py): what the model is sent.
        self.compaction: dict[str, Any] | None = None
        for k, b in log:
            if k == "message":
                self.messages.append(Message.from_dict(b))
                self.hash = digest([self.hash, b])
            elif k == "compaction":
                self.compaction = b
                self.hash = digest([self.hash, {"compaction": b["upto"]}])
        self.turns = [TurnRecord.from_dict(b) for k, b in log if k == "turn"]
        self.seq = len(log)
        self.seen = {str(b.get("artifact")) for k, b in log if k == "artifact"}
        self.pending: list[tuple[str, int, str, dict[str, Any]]] = []

    def _log(self, kind: str, body: dict[str, Any]) -> None:
        self.pending.append((self.node, self.seq, kind, self.kept(body)))
        self.seq += 1

    def kept(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` as it may be stored: sealed whole when it quotes a secret of the task."""
        if not self.secrets.values:
            return body
        text = json.dumps(body, default=str)
        if not any(secret in text for secret in self.secrets.values):
            return body
        sealed: dict[str, Any] = self.sealer.seal_leaves({"sealed": SecretStr(text)})
        return sealed

    def add(self, message: dict[str, Any]) -> None:
        self.messages.append(Message.from_dict(message))
        self.hash = digest([self.hash, message])
        self._log("message", message)

    def awaits_calls(self) -> bool:
        """The last proposal's tool calls are still to be answered (the task parked on
        one of them): they run again, and the model is not asked this turn again."""
        last = self.messages[-1]
        return last.role == "assistant" and bool(last.tool_calls)

    def view(self) -> list[Message]:
        """The messages the model is sent: all of them, or since a compaction its head,
        the summary with the pinned facts, and what came after the cut."""
        c = self.compaction
        if c is None:
            return list(self.messages)
        return [*self.messages[:c["head"]], summary_message(c["summary"], c["pinned"]),
                *self.messages[c["upto"]:]]

    def compact(self, head: int, upto: int, summary: str, pinned: list[str]) -> None:
        """Fold messages ``[head, upto)`` into ``summary`` (logged: a resumed task sends
        the same view)."""
        entry = {"head": head, "upto": upto, "summary": summary, "pinned": pinned}
        self.compaction = entry
        self.hash = digest([self.hash, {"compaction": upto}])
        self._log("compaction", entry)

    def add_turn(self, record: TurnRecord) -> None:
        self.turns.append(record)
        self._log("turn", record.to_dict())

    def see(self, artifact: str) -> bool:
        """Note a tool result; True when it was not seen before in this conversation."""
        if artifact in self.seen:
            return False
        self.seen.add(artifact)
        self._log("artifact", {"artifact": artifact})
        return True

    def flush(self) -> list[tuple[str, int, str, dict[str, Any]]]:
        out, self.pending = self.pending, []
        return out

    def get(self, what: str, default: Any = None) -> Any:
        return self.state.get(f"{self.p}{what}", default)

    def set(self, what: str, value: Any) -> None:
        self.state[f"{self.p}{what}"] = value


def _opened(body: dict[str, Any]) -> dict[str, Any]:
    """A stored agent-log body as it was written (see :meth:`Conversation.kept`)."""
    sealed = body.get("sealed")
    if isinstance(sealed, SecretStr):
        opened: dict[str, Any] = json.loads(sealed.get_secret_value())
        return opened
    return body
