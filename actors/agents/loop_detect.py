"""Loop detection for agent nodes, as pure functions over the turn history.

Three patterns, checked after every turn:

- **no progress**: the same fingerprint (the tool calls and their arguments) ``repeat``
  times in a row, none of those turns producing a new artifact (a tool result not seen
  before in the conversation);
- **alternation**: tool calls alternating A, B, A, B … over ``alternation`` calls;
- **oscillation**: a watched field (``watch_field``, read from each turn's last tool result:
  the state of the world as the agent observes it) flipping back and forth between two
  values at least ``flips`` times within the last ``window`` turns.

On the first detection the runtime intervenes once (a corrective message to the model); on
the next it stops the node with LOOP_DETECTED, keeping the evidence.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LoopPolicy", "TurnRecord", "Detection", "detect"]


@dataclass(frozen=True)
class LoopPolicy:
    repeat: int = 3
    alternation: int = 6
    watch_field: str | None = None
    window: int = 8
    flips: int = 4

    def __post_init__(self) -> None:
        if self.repeat < 2 or self.alternation < 4 or self.window < 2 or self.flips < 2:
            raise ValueError(f"loop policy thresholds too small: {self}")


@dataclass(frozen=True)
class TurnRecord:
    fingerprint: str  # hash of the turn's tool calls and arguments ("" for a text answer)
    calls: tuple[str, ...]  # tool names called this turn, in order
    new_artifacts: bool  # a tool result not seen before in this conversation
    field_value: Any = None  # the watched state field after the turn

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "calls": list(self.calls),
                "new_artifacts": self.new_artifacts, "field_value": self.field_value}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TurnRecord:
        return cls(d["fingerprint"], tuple(d["calls"]), bool(d["new_artifacts"]),
                   d.get("field_value"))


@dataclass(frozen=True)
class Detection:
    pattern: str  # "no_progress" | "alternation" | "oscillation"
    evidence: dict[str, Any]


def detect(history: Sequence[TurnRecord], policy: LoopPolicy) -> Detection | None:
    """The first loop pattern the history shows, or None."""
    recent = list(history[-policy.repeat:])
    if len(recent) == policy.repeat and recent[0].fingerprint and \
            all(t.fingerprint == recent[0].fingerprint for t in recent) and \
            not any(t.new_artifacts for t in recent):
        return Detection("no_progress", {"fingerprint": recent[0].fingerprint,
                                         "times": policy.repeat,
                                         "calls": list(recent[0].calls)})
    calls = [c for t in history for c in t.calls][-policy.alternation:]
    if len(calls) == policy.alternation and calls[0] != calls[1] and all(
            c == calls[i % 2] for i, c in enumerate(calls)):
        return Detection("alternation", {"sequence": calls})
    if policy.watch_field is not None:
        values = [t.field_value for t in history[-policy.window:]]
        changes = sum(1 for a, b in itertools.pairwise(values) if a != b)
        if changes >= policy.flips and len({repr(v) for v in values}) <= 2:
            return Detection("oscillation", {"field": policy.watch_field, "values": values})
    return None
