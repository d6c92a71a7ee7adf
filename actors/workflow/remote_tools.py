"""Tools served by other processes: ``remote_tool`` declares one.

A remote tool is declared like any tool (argument and result models, kind, the idempotency
key of a write, timeout, retry policy, compensation) but has no code here: a call is a
request on ``ratchet.tools.<tenant>.<name>`` answered by a tool worker — ``ToolWorker``
(actors/effects/tool_worker.py) serving the same declaration with code, or a worker in
another language (docs/protocol.md, "Serving a tool from another process or language").
The action ledger guards it exactly as an in-process tool: IN_FLIGHT is committed before
the request leaves; no reply within ``timeout`` is an unknown outcome, reconciled by the
``query`` op (``has_query=True``) or handed to a human.

A Python worker serves the tool with :func:`served_by`: the same declaration with its code
(and query) attached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from ratchet.actors.workflow.tools import (
    BreakerPolicy,
    Compensation,
    Kind,
    RetryPolicy,
    Risk,
    Tool,
    ToolContext,
)
from ratchet.protocol.errors import ToolDefinitionError

__all__ = ["remote_tool", "served_by"]


def _not_here(ctx: ToolContext, args: Any) -> Any:
    # Never run: a remote tool's calls go to its workers (actors/effects/remote_tool.py).
    raise ToolDefinitionError(f"tool {ctx.tool!r} is served by tool workers, not in process")


def remote_tool(name: str, *, kind: Kind, args: type[BaseModel], result: type[BaseModel],
                key: Callable[[Any], str] | None = None, timeout: float = 10.0,
                retry: RetryPolicy | None = None, has_query: bool = False,
                compensate: Compensation | None = None, breaker: BreakerPolicy | None = None,
                risk: Risk | None = None, requires_approval: bool = False,
                max_amount: float | None = None,
                amount: str | Callable[[Any], float] | None = None,
                session: str = "default") -> Tool[Any, Any]:
    """A tool served by tool workers. ``name`` is one subject token
    (``[A-Za-z0-9_-]{1,64}``); ``has_query``: its workers answer the ``query`` op (look the
    outcome up by the idempotency key), so an unknown outcome can be reconciled.
    ``session``: a name other than ``"default"`` gives the tool a session per task, pinned
    to the worker that took it (its state stored by the node, its live resources kept by
    the worker: actors/effects/pinned_sessions.py); ``"default"``: none, every call to any
    worker.

    Raises:
        ToolDefinitionError: as for any tool, naming the bad part.
    """
    return Tool(name, _not_here, kind, args, result, key, timeout, retry or RetryPolicy(),
                _not_here if has_query else None, compensate, session, breaker, risk,
                requires_approval, max_amount, amount, None, remote=True)


def served_by(declared: Tool[Any, Any], fn: Callable[[ToolContext, Any], Any],
              query: Callable[[ToolContext, Any], Any] | None = None) -> Tool[Any, Any]:
    """The declaration ``declared`` with the code that serves it, for a ``ToolWorker``.

    Raises:
        ToolDefinitionError: ``declared`` promises a query and none is given, or the other
            way round.
    """
    if (declared.query is not None) != (query is not None):
        raise ToolDefinitionError(
            f"tool {declared.name!r}: give a query exactly when the declaration has one")
    return dataclasses.replace(declared, fn=fn, query=query)
