"""The ``ratchet`` command's output for people: answers rendered with rich (tables, relative
times, colours: ``cli/render.py``), error lines in red on stderr, and ``watch``'s progress
bar. Imported only when people read the output (``cli/output.py`` chooses), so a command
whose output is JSON lines — a serving node's above all — never loads rich.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from ratchet.protocol.catalogue import EventType
from ratchet.protocol.messages import Event
from ratchet.protocol.states import TaskStatus
from ratchet.supervisors.cli.render import event_line, render_answer

__all__ = ["HumanOutput", "ProgressView"]


class HumanOutput:
    """Answers rendered for people (the ``Printer`` of ``cli/output.py`` for them).

    Args:
        console: rich console on stdout.
        errors: rich console on stderr, for error lines.
        clock: the wall clock "3 s ago" is measured from.
    """

    human = True

    def __init__(self, console: Console, errors: Console,
                 clock: Callable[[], float] = time.time) -> None:
        self.console = console
        self.errors = errors
        self.clock = clock

    @classmethod
    def on_stdout(cls) -> HumanOutput:
        """On this process's stdout and stderr; no colours if ``NO_COLOR`` is set."""
        no_color = "NO_COLOR" in os.environ
        # force_terminal: `--output human` into a pipe still gets the tables (without colour
        # codes only if NO_COLOR says so); highlight off: no guessing colours from the text.
        return cls(Console(highlight=False, force_terminal=True, no_color=no_color),
                   Console(stderr=True, highlight=False, no_color=no_color))

    def emit(self, answer: Any) -> None:
        """Print one answer, rendered."""
        self.console.print(render_answer(answer, self.clock()))

    def error(self, error: dict[str, Any]) -> None:
        """A typed error a node answered, as one red line on stderr."""
        line = Text("error ", style="bold red")
        line.append(str(error.get("code", "INTERNAL")), style="bold red")
        line.append(f": {error.get('message', '')}")
        details = error.get("details") or {}
        if details:
            line.append(" (" + ", ".join(f"{k}={v}" for k, v in details.items()) + ")",
                        style="dim")
        self.errors.print(line, soft_wrap=True)

    def watch_view(self, task_id: str, steps_total: int | None = None) -> ProgressView:
        """The view ``watch`` prints ``task_id``'s events through."""
        return ProgressView(self, task_id, steps_total)


class ProgressView:
    """``watch`` for people: one line per event above a progress bar. ``task.progress``
    events set it (steps completed of the workflow's steps), a terminal event fills it and
    colours it by the outcome. The bar is drawn between enter and exit."""

    def __init__(self, output: HumanOutput, task_id: str,
                 steps_total: int | None = None) -> None:
        self.output = output
        self.task_id = task_id
        self.console = output.console
        self._progress: Progress | None = None
        self._bar: TaskID | None = None
        self._completed = 0
        self._total = steps_total

    def __enter__(self) -> ProgressView:
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=self.console, transient=False)
        self._progress.start()
        self._bar = self._progress.add_task(escape(self.task_id), total=self._total)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def show(self, event: Event) -> None:
        """Print one event and move the bar by it."""
        if self._progress is None or self._bar is None:  # not entered: no bar to draw
            self.output.emit(event.model_dump())
            return
        self._progress.console.print(event_line(event), soft_wrap=True)
        description = None
        if event.type == EventType.TASK_PROGRESS:
            self._total = _count(event.payload.get("steps_total")) or self._total
            self._completed = max(self._completed, _count(event.payload.get("steps_completed")))
            node = event.payload.get("node")
            description = escape(f"{self.task_id} · {node}") if node else None
        elif event.type == EventType.STEP_COMPLETED:
            self._completed += 1
        status = _TERMINAL_EVENTS.get(event.type)
        if status is not None:
            self._total = self._completed = max(self._total or 0, self._completed, 1)
            style = "green" if status == TaskStatus.SUCCEEDED else "red"
            description = f"[{style}]{escape(self.task_id)} {status.value}"
        if self._total is not None:  # a graph may revisit nodes: more steps than it has
            self._total = max(self._total, self._completed)
        self._progress.update(self._bar, completed=self._completed, total=self._total,
                              description=description)


def _count(value: Any) -> int:
    """A count from an event's payload (0 if it is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


#: The events that end a task, and the status each ends it in.
_TERMINAL_EVENTS: dict[str, TaskStatus] = {
    EventType.TASK_SUCCEEDED: TaskStatus.SUCCEEDED,
    EventType.TASK_FAILED: TaskStatus.FAILED,
    EventType.TASK_CANCELLED: TaskStatus.CANCELLED,
}
