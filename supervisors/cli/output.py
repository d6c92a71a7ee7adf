"""How the ``ratchet`` command prints: tables for people, JSON lines for machines.

Every command prints its answer through :func:`emit`. The mode is chosen once per run
(:func:`set_output`, from ``--output``): ``json`` prints each answer as one JSON line,
byte for byte what scripts and the tests read; ``human`` renders it with rich (tables,
relative times, colours: ``cli/render.py``); ``auto``, the default, is ``human`` when
stdout is a terminal and ``json`` when it is a pipe or a file.

Errors: a refused request (a typed error from a node) is ``{"error": ...}`` on stdout in
JSON, one red line on stderr for people (:func:`show_error`); a usage error is one line on
stderr in either mode (:func:`show_usage_error`). ``watch`` prints through a
:class:`WatchView`: JSON lines, or one line per event above a progress bar fed by the
task's ``task.progress`` events.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from enum import StrEnum
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

__all__ = ["Output", "OutputMode", "WatchView", "current_output", "emit", "set_output",
           "show_error", "show_usage_error", "watch_view"]


class OutputMode(StrEnum):
    """``--output``: who reads stdout."""

    #: People on a terminal, machines otherwise.
    AUTO = "auto"
    #: One JSON object per line, whatever stdout is.
    JSON = "json"
    #: Tables and colours, whatever stdout is.
    HUMAN = "human"


class Output:
    """Where and how answers are printed: ``console`` for people, ``None`` for JSON lines.

    Args:
        console: rich console on stdout (human mode), or None (JSON lines).
        errors: rich console on stderr, for error lines in human mode.
        clock: the wall clock "3 s ago" is measured from.
    """

    def __init__(self, console: Console | None, errors: Console,
                 clock: Callable[[], float] = time.time) -> None:
        self.console = console
        self.errors = errors
        self.clock = clock

    @property
    def human(self) -> bool:
        return self.console is not None

    def emit(self, answer: Any) -> None:
        """Print one answer: a JSON line, or its rendering."""
        if self.console is None:
            print(json.dumps(answer, default=str), flush=True)
        else:
            self.console.print(render_answer(answer, self.clock()))

    def error(self, error: dict[str, Any]) -> None:
        """A typed error a node answered (its wire form: code, message, details)."""
        if self.console is None:
            self.emit({"error": error})
            return
        line = Text("error ", style="bold red")
        line.append(str(error.get("code", "INTERNAL")), style="bold red")
        line.append(f": {error.get('message', '')}")
        details = error.get("details") or {}
        if details:
            line.append(" (" + ", ".join(f"{k}={v}" for k, v in details.items()) + ")",
                        style="dim")
        self.errors.print(line, soft_wrap=True)


def _consoles(mode: OutputMode) -> tuple[Console | None, Console]:
    errors = Console(stderr=True, highlight=False, no_color="NO_COLOR" in os.environ)
    human = mode == OutputMode.HUMAN or (mode == OutputMode.AUTO and sys.stdout.isatty())
    if not human:
        return None, errors
    # force_terminal: `--output human` into a pipe still gets the tables (without colour
    # codes only if NO_COLOR says so); highlight off: no guessing colours from the text.
    return Console(highlight=False, force_terminal=True,
                   no_color="NO_COLOR" in os.environ), errors


_current = Output(*_consoles(OutputMode.AUTO))


def set_output(mode: OutputMode | str) -> Output:
    """Choose how this run prints (once, as the command starts); returns the choice."""
    global _current
    _current = Output(*_consoles(OutputMode(mode)))
    return _current


def current_output() -> Output:
    return _current


def emit(answer: Any) -> None:
    """Print one answer of a command in this run's mode (:func:`set_output`)."""
    _current.emit(answer)


def show_error(error: dict[str, Any]) -> None:
    """Print a typed error a node answered, in this run's mode."""
    _current.error(error)


def show_usage_error(prog: str, message: str) -> None:
    """A usage error as one line on stderr, in every mode: what is wrong, what to do."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


class WatchView:
    """What ``ratchet watch`` shows as a task's events arrive.

    JSON mode prints each event as one JSON line (its ``model_dump()``). Human mode prints
    one line per event above a progress bar: ``task.progress`` events set it (steps
    completed of the workflow's steps), a terminal event fills it and colours it by the
    outcome. Use it as a context manager (the bar is drawn between enter and exit) and call
    :meth:`show` with each event.
    """

    def __init__(self, output: Output, task_id: str, steps_total: int | None = None) -> None:
        self.output = output
        self.task_id = task_id
        self._progress: Progress | None = None
        self._bar: TaskID | None = None
        self._completed = 0
        self._total = steps_total

    def __enter__(self) -> WatchView:
        if self.output.console is not None:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=self.output.console, transient=False)
            self._progress.start()
            self._bar = self._progress.add_task(escape(self.task_id), total=self._total)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def show(self, event: Event) -> None:
        """Print one event and move the bar by it."""
        if self._progress is None or self._bar is None:
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


def watch_view(task_id: str, steps_total: int | None = None) -> WatchView:
    """The view ``watch`` prints ``task_id``'s events through, in this run's mode
    (``steps_total``: the workflow's step count, if known, e.g. from the task's snapshot;
    else the first ``task.progress`` event tells it)."""
    return WatchView(_current, task_id, steps_total)
