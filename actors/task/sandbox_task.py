"""What a task actor enters as it loads its task: the task's trace (protocol/tracing.py)
and, for a sandbox fork, its mark on every log line.

A sandbox fork's log lines carry ``sandbox=True`` and ``sandbox_of=<source>``: bound on the
actor's logger, and as structlog context variables of the actor's own asyncio task (no
other task shares its context), so that its steps' ``ctx.log`` lines and everything logged
while it runs carry them too (the node's logging merges context variables:
supervisors/node/log_output.py). A search of a node's log can then keep a what-if run apart
from production, as its events are kept apart by their subjects.
"""

from __future__ import annotations

import structlog

from ratchet.actors.task.kernel import TaskKernel
from ratchet.persistence.records import TaskRecord
from ratchet.protocol import tracing

__all__ = ["enter_task"]


def enter_task(actor: TaskKernel, rec: TaskRecord) -> None:
    """Run in the actor's own task, from its ``on_start``: a raise crashes the start."""
    tracing.enter_task(rec.traceparent)  # its steps' spans continue its submit's trace
    if rec.sandbox:
        marks = {"sandbox": True, "sandbox_of": rec.sandbox.get("source")}
        structlog.contextvars.bind_contextvars(**marks)
        actor.log = actor.log.bind(**marks)
