"""Where a node's log lines go: best effort, never a crash; readable on a terminal, JSON
lines for machines.

A log line is written from inside whatever runs: an actor's ``receive``, a supervisor's
restart, a commit's error path. With structlog's plain ``PrintLogger`` a full disk under
the log file (``ENOSPC``) or a closed pipe raised ``OSError`` out of ``log.warning(...)``
into that code: actors crashed for want of log space, their restarts logged and crashed
again, and the root supervisor gave up (measured: no responders for ~60 s, then exit 1,
although the store was fine). Losing a log line is better than losing the node: a failed
write is swallowed and counted (:func:`log_write_failures`, in the ``stopped`` line of
``ratchet serve``), and writing resumes by itself once the file accepts bytes again.

Two renderings of one chain (:func:`configure_logging`): on a terminal, coloured lines
(``12:03:04 [warning ] dead-letter failed  error=...``) with the exception's traceback
drawn below its line; piped or redirected, one JSON object per line with the traceback as
a string (``exception``). The standard library's loggers (asyncio's "Task exception was
never retrieved", nats-py's reconnects) are routed through the same processors, so a
process writes one format only.

Log lines never carry a live task's secret: :func:`install_log_redaction` puts
``protocol.redaction.redact_log_event`` before the renderer of whatever chain is configured.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor

from ratchet.protocol import tracing
from ratchet.protocol.redaction import redact_log_event

__all__ = ["BestEffortHandler", "BestEffortLogger", "BestEffortLoggerFactory", "LOG_LEVELS",
           "configure_logging", "install_log_redaction", "log_write_failures"]

#: The levels ``--log-level`` accepts, lowest first.
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

_failures = 0
_count_lock = threading.Lock()


def log_write_failures() -> int:
    """Log lines lost because their write failed, in this process so far."""
    return _failures


class BestEffortLogger(structlog.PrintLogger):
    """A ``PrintLogger`` whose write errors are counted instead of raised."""

    def msg(self, message: str) -> None:
        global _failures
        try:
            super().msg(message)
        except (OSError, ValueError):  # ENOSPC, EPIPE, EIO; ValueError: the file was closed
            with _count_lock:
                _failures += 1

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class BestEffortLoggerFactory:
    """structlog's ``logger_factory``: a :class:`BestEffortLogger` on ``file``."""

    def __init__(self, file: TextIO | None = None) -> None:
        self._file = file or sys.stderr

    def __call__(self, *args: Any) -> BestEffortLogger:
        return BestEffortLogger(self._file)


class BestEffortHandler(logging.Handler):
    """The root logging handler: a standard library record rendered by structlog's chain
    (its ``formatter``, a ``ProcessorFormatter``) and written best effort, like structlog's
    own lines. It runs in whichever thread logged the record; a write error is counted."""

    def __init__(self, file: TextIO) -> None:
        super().__init__()
        self._out = BestEffortLogger(file)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a record whose arguments do not format: logging's own report
            self.handleError(record)
            return
        self._out.msg(line)


def install_log_redaction() -> None:
    """Add the redacting processor to structlog's chain, just before its last processor
    (the renderer: what it renders is then already redacted), unless it is there. A node
    calls it as it starts, so an application's own logging configuration is covered too;
    loggers cached before (``cache_logger_on_first_use``) keep their chain."""
    processors = list(structlog.get_config()["processors"])
    if redact_log_event in processors:
        return
    processors.insert(max(0, len(processors) - 1), redact_log_event)
    structlog.configure(processors=processors)


def add_trace_id(_logger: Any, _method: str, event: EventDict) -> EventDict:
    """The current trace's id on a line logged inside a span (``trace_id``, 32 hex digits:
    search the trace backend for it); nothing when tracing is off (protocol/tracing.py)."""
    if "trace_id" not in event:
        trace = tracing.trace_id()
        if trace is not None:
            event["trace_id"] = trace
    return event


def _renderer(console: bool) -> list[Processor]:
    """The chain's last processors: how an event dict becomes a line."""
    if not console:
        return [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    # No locals in tracebacks: a frame's variables may hold a task's secrets, which the
    # redacting processor (it sees the event dict only) cannot reach. The standard
    # library's traceback where structlog was imported without rich (ratchet/__main__.py:
    # the command whose log lines are JSON).
    traceback: Any = structlog.dev.plain_traceback
    if getattr(structlog.dev, "rich", None) is not None:
        traceback = structlog.dev.RichTracebackFormatter(show_locals=False, max_frames=20)
    return [structlog.dev.ConsoleRenderer(colors="NO_COLOR" not in os.environ,
                                          exception_formatter=traceback)]


def configure_logging(level: str, *, console: bool | None = None) -> None:
    """Log lines on stderr at ``level`` (one of :data:`LOG_LEVELS`) and above, written best
    effort: coloured lines when ``console`` (by default: when stderr is a terminal), else
    JSON lines. The standard library's loggers go through the same chain at the same
    level. Calling it again replaces the previous configuration.

    Raises:
        ValueError: ``level`` is not one of :data:`LOG_LEVELS`.
    """
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LOG_LEVELS)}")
    threshold: int = getattr(logging, level.upper())
    if console is None:
        console = sys.stderr.isatty()
    stamp = structlog.processors.TimeStamper(fmt="%H:%M:%S" if console else "iso",
                                             utc=not console)
    shared: list[Processor] = [structlog.processors.add_log_level, stamp, add_trace_id]
    rendering = [redact_log_event, *_renderer(console)]  # a live task's secrets never reach the log
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *shared, *rendering],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        # A failed log write (a full disk under the log file) is counted, never raised.
        logger_factory=BestEffortLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = BestEffortHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendering]))
    logging.basicConfig(handlers=[handler], level=threshold, force=True)
