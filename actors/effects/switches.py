"""Kill switches for incidents, read on every call and every step (in memory, loaded from
the store at start and changed by the admin service, which persists them first).

- a disabled tool: no new call of it is made, anywhere — the action fails with
  UNAVAILABLE ``tool disabled``; calls already in flight finish (or end UNKNOWN);
- frozen dispatch: no new step starts — running steps finish at their safe point, tasks
  wait (QUEUED or between steps) until thawed.
"""

from __future__ import annotations

__all__ = ["Switches"]


class Switches:
    def __init__(self) -> None:
        self.disabled_tools: set[str] = set()
        self.frozen = False

    def load(self, rows: list[tuple[str, str]]) -> None:
        self.disabled_tools = {name for kind, name in rows if kind == "tool"}
        self.frozen = any(kind == "freeze" for kind, _ in rows)
