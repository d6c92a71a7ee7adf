"""Context compaction for agent nodes: what a long conversation is folded into.

A node may declare ``compact=Compaction(summarizer=model, at_tokens=8000, keep_last=6,
pinned=lambda state, input: [...])``. Before a turn whose request would pass ``at_tokens``,
the runtime asks the summarizer (a model call, recorded in the ledger like any other) for
a summary of the middle of the conversation, then sends the model:

- the head, verbatim: the node's system message and its first user message (the task's
  goal and constraints as the workflow stated them);
- one user message: the summary, then the **pinned facts**, written by the runtime, not by
  the summarizer, so none can be lost: every side effect the task has already taken (its
  succeeded writes: key, tool, provider id) and whatever the node's ``pinned(state,
  input)`` returns;
- the last ``keep_last`` messages, verbatim (never cutting between a tool call and its
  result).

The full history stays in the agent log; the compaction is one more entry of it (where it
cut, the summary, the pinned facts), so a resumed task rebuilds the same view without
asking the summarizer again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.actors.agents.models import Message

__all__ = ["Compaction", "SUMMARIZER_SYSTEM", "cut_point", "summary_message", "transcript"]

SUMMARIZER_SYSTEM = (
    "You compact an agent's conversation. Summarize the transcript you are given: what was "
    "asked, what was found, what was decided, what is still open. Keep every number, id and "
    "name that a later step may need. Answer with the summary only.")


@dataclass(frozen=True)
class Compaction:
    summarizer: Any  # a Model, or the name of a registry resource holding one
    at_tokens: int = 8000
    keep_last: int = 6
    pinned: Callable[[Mapping[str, Any], Mapping[str, Any]], Sequence[str]] | None = None

    def __post_init__(self) -> None:
        if self.at_tokens < 1 or self.keep_last < 1:
            raise ValueError(f"compaction needs at_tokens >= 1 and keep_last >= 1: {self}")


def cut_point(messages: Sequence[Message], head: int, keep_last: int) -> int | None:
    """Where the kept tail starts: ``keep_last`` messages from the end, moved back so the
    tail does not begin with a tool result (its call must stay with it); None when there
    is nothing between the head and the tail to compact."""
    cut = len(messages) - keep_last
    while cut > head and messages[cut].role == "tool":
        cut -= 1
    return cut if cut > head + 1 else None  # folding one message into a summary saves nothing


def transcript(messages: Sequence[Message]) -> str:
    """The messages to summarize, as text the summarizer reads."""
    lines = []
    for m in messages:
        if m.tool_calls:
            calls = "; ".join(f"{c.name}({json.dumps(c.arguments, sort_keys=True)})"
                              for c in m.tool_calls)
            lines.append(f"{m.role}: calls {calls}")
        if m.content:
            who = f"tool {m.name}" if m.role == "tool" and m.name else m.role
            lines.append(f"{who}: {m.content}")
    return "\n".join(lines)


def summary_message(summary: str, pinned: Sequence[str]) -> Message:
    """The message that stands for the compacted middle of the conversation."""
    text = f"Summary of the conversation so far:\n{summary.strip()}"
    if pinned:
        text += "\n\nPinned facts (kept verbatim):\n" + "\n".join(f"- {p}" for p in pinned)
    return Message("user", text)
