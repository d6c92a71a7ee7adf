"""How the ``ratchet`` command prints: tables for people, JSON lines for machines.

Every command prints its answer through :func:`emit`. The mode is chosen once per run
(:func:`set_output`, from ``--output``): ``json`` prints each answer as one JSON line,
byte for byte what scripts and the tests read; ``human`` renders it with rich (tables,
relative times, colours: ``cli/human.py`` and ``cli/render.py``, imported only then);
``auto``, the default, is ``human`` when stdout is a terminal and ``json`` when it is a
pipe or a file.

Errors: a refused request (a typed error from a node) is ``{"error": ...}`` on stdout in
JSON, one red line on stderr for people (:func:`show_error`); a usage error is one line on
stderr in either mode (:func:`show_usage_error`). ``watch`` prints through a
:class:`WatchView`: JSON lines, or one line per event above a progress bar fed by the
task's ``task.progress`` events.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ratchet.protocol.messages import Event

__all__ = ["Output", "OutputMode", "Printer", "View", "WatchView", "current_output", "emit",
           "set_output", "show_error", "show_usage_error", "watch_view"]


class OutputMode(StrEnum):
    """``--output``: who reads stdout."""

    #: People on a terminal, machines otherwise.
    AUTO = "auto"
    #: One JSON object per line, whatever stdout is.
    JSON = "json"
    #: Tables and colours, whatever stdout is.
    HUMAN = "human"


class View(Protocol):
    """What ``watch`` prints a task's events through: a context manager, then
    :meth:`show` with each event."""

    def __enter__(self) -> View: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def show(self, event: Event) -> None: ...


class Printer(Protocol):
    """How a run prints: :class:`Output` (JSON lines) or
    :class:`~ratchet.supervisors.cli.human.HumanOutput` (for people)."""

    human: bool

    def emit(self, answer: Any) -> None: ...

    def error(self, error: dict[str, Any]) -> None: ...

    def watch_view(self, task_id: str, steps_total: int | None = None) -> View: ...


class Output:
    """Answers printed as one JSON line each on stdout (the :class:`Printer` for
    machines)."""

    #: True when people read the answers (tables, colours, a progress bar).
    human = False

    def emit(self, answer: Any) -> None:
        """Print one answer as a JSON line."""
        print(json.dumps(answer, default=str), flush=True)

    def error(self, error: dict[str, Any]) -> None:
        """A typed error a node answered (its wire form: code, message, details)."""
        self.emit({"error": error})

    def watch_view(self, task_id: str, steps_total: int | None = None) -> WatchView:
        """The view ``watch`` prints ``task_id``'s events through."""
        return WatchView(self, task_id)


class WatchView:
    """What ``ratchet watch`` shows as a task's events arrive: here each event as one JSON
    line (its ``model_dump()``); for people, a line per event above a progress bar
    (:class:`~ratchet.supervisors.cli.human.ProgressView`)."""

    def __init__(self, output: Output, task_id: str) -> None:
        self.output = output
        self.task_id = task_id

    def __enter__(self) -> WatchView:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def show(self, event: Event) -> None:
        """Print one event."""
        self.output.emit(event.model_dump())


def _output_for(mode: OutputMode) -> Printer:
    human = mode == OutputMode.HUMAN or (mode == OutputMode.AUTO and sys.stdout.isatty())
    if not human:
        return Output()
    # rich only when people read the output: a serving node's start does not load it
    # (docs/operations.md, "Restart (W4)").
    from ratchet.supervisors.cli.human import HumanOutput

    return HumanOutput.on_stdout()


_current: Printer | None = None


def set_output(mode: OutputMode | str) -> Printer:
    """Choose how this run prints (once, as the command starts); returns the choice."""
    global _current
    _current = _output_for(OutputMode(mode))
    return _current


def current_output() -> Printer:
    """This run's choice (``auto`` until :func:`set_output` is called)."""
    global _current
    if _current is None:
        _current = _output_for(OutputMode.AUTO)
    return _current


def emit(answer: Any) -> None:
    """Print one answer of a command in this run's mode (:func:`set_output`)."""
    current_output().emit(answer)


def show_error(error: dict[str, Any]) -> None:
    """Print a typed error a node answered, in this run's mode."""
    current_output().error(error)


def show_usage_error(prog: str, message: str) -> None:
    """A usage error as one line on stderr, in every mode: what is wrong, what to do."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


def watch_view(task_id: str, steps_total: int | None = None) -> View:
    """The view ``watch`` prints ``task_id``'s events through, in this run's mode
    (``steps_total``: the workflow's step count, if known, e.g. from the task's snapshot;
    else the first ``task.progress`` event tells it)."""
    return current_output().watch_view(task_id, steps_total)
