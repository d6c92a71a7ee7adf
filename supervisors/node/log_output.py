"""Where a node's log lines go: best effort, never a crash.

A log line is written from inside whatever runs: an actor's ``receive``, a supervisor's
restart, a commit's error path. With structlog's plain ``PrintLogger`` a full disk under
the log file (``ENOSPC``) or a closed pipe raised ``OSError`` out of ``log.warning(...)``
into that code: actors crashed for want of log space, their restarts logged and crashed
again, and the root supervisor gave up (measured: no responders for ~60 s, then exit 1,
although the store was fine). Losing a log line is better than losing the node: a failed
write is swallowed and counted (:func:`log_write_failures`, in the ``stopped`` line of
``ratchet serve``), and writing resumes by itself once the file accepts bytes again.

Log lines never carry a live task's secret: :func:`install_log_redaction` puts
``protocol.redaction.redact_log_event`` before the renderer of whatever chain is configured.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, TextIO

import structlog

from ratchet.protocol.redaction import redact_log_event

__all__ = ["BestEffortLogger", "BestEffortLoggerFactory", "configure_logging",
           "install_log_redaction",
           "log_write_failures"]

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


def configure_logging(level: str) -> None:
    """JSON lines on stderr at ``level`` and above, written best effort."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            redact_log_event,  # a live task's secrets never reach the log
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # A failed log write (a full disk under the log file) is counted, never raised.
        logger_factory=BestEffortLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
