"""Serving one tool request: the worker's half of a tool call, whichever worker it is.

Every tool call is a :class:`~protocol.tool_wire.ToolRequest` answered by a
:class:`~protocol.tool_wire.ToolReply` (docs/protocol.md, "Serving a tool from another
process or language"). Two workers serve them with this code: ``ToolWorker``
(actors/effects/tool_worker.py), in another process, over JetStream; and the node's own
:class:`~actors.effects.local_tools.LocalToolWorker`, for the tools whose code the node
has, through an in-process loopback. Both run a request the same way — look the code up
(the call or its ``query``), validate the arguments against the tool's model, run the code
in the request's session (a supervised session actor) within the request's deadline, and
turn what it raised into a reply code (``error_of_exception``) — and differ only in how
the request reaches them and the reply goes back (docs/architecture.md, "Tool calls: one
path").

A reply made here keeps the objects the code returned: the result model as it is, and the
exception a failure came from (a :class:`RaisedReply`, never on the wire). A transport that
sends the reply as bytes makes it wire data first (:func:`wire_reply`); the loopback hands
it over as it is, so an in-process tool's caller sees its result and its exception
unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, PrivateAttr, ValidationError

from ratchet.actors.workflow.tools import Accepted, Tool, ToolContext
from ratchet.protocol.errors import ToolOutcomeUnknown
from ratchet.protocol.redaction import dump_model
from ratchet.protocol.tool_wire import (
    ToolAccepted,
    ToolReply,
    ToolReplyError,
    ToolRequest,
    error_of_exception,
    revealed,
)

__all__ = ["Blocking", "RaisedReply", "SessionCall", "SessionHost", "addressed", "failure",
           "raised", "run_tool", "wire_reply"]

#: How blocking tool code is run off the loop: ``blocking(call)`` awaits ``call()`` run on
#: a thread. A cancel (the deadline) abandons the call, which cannot be interrupted.
Blocking = Callable[[Callable[[], Any]], Awaitable[Any]]


async def _to_thread(call: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(call)


@dataclass(frozen=True, slots=True)
class SessionCall:
    """Run ``request`` in the session actor that gets it, within ``budget`` seconds.
    ``on_reply``: told the reply as soon as it is made, in the session's task (the local
    worker's way back to the caller; the answer to the ask follows it)."""

    request: ToolRequest
    tool: Tool[Any, Any]
    budget: float
    on_reply: Callable[[ToolReply], None] | None = None
    #: The caller's fencing scope (``persistence.records.fence_scope``: a fan-out branch's
    #: id), for the session's write of its state.
    fence: tuple[str, ...] | None = None


class SessionHost(Protocol):
    """Where a worker runs the requests of tools with a session: the session's actor."""

    async def call(self, request: ToolRequest, tool: Tool[Any, Any],
                   budget: float) -> ToolReply:
        """Run ``request`` in its session; its reply (a session that failed: a failed
        reply, ``OUTCOME_UNKNOWN``)."""


async def run_tool(request: ToolRequest, tool: Tool[Any, Any], budget: float,
                   session: dict[str, Any], live: dict[str, Any],
                   resources: Any, blocking: Blocking | None = None) -> ToolReply:
    """Run ``tool``'s code for ``request`` (its call or its query) within ``budget``
    seconds; its reply. Tool code sees ``session`` and ``live`` (changed in place).
    A failure of the code is an answer, never a raise."""
    fn = tool.fn if request.op == "call" else tool.query
    if fn is None:
        return failure("INVALID_ARGUMENT", f"{tool.name} has no query")
    try:
        # A loopback request carries the model itself: validating it returns it as is.
        args = tool.args.model_validate(request.args)
    except ValidationError as exc:
        return failure("INVALID_ARGUMENT", f"arguments of {tool.name}: {exc.errors()[:3]}")
    ctx = ToolContext(request.task_id, request.tenant, tool.name, request.idempotency_key,
                      request.attempt, session, resources, live)
    try:
        async with asyncio.timeout(budget):
            if asyncio.iscoroutinefunction(fn):
                value = await fn(ctx, args)
            else:  # blocking code: a thread (it cannot be interrupted at the deadline)
                value = await (blocking or _to_thread)(lambda: fn(ctx, args))
    except TimeoutError:
        return raised(ToolOutcomeUnknown(f"{tool.name} timed out after {budget:.3g}s",
                                         tool=tool.name))
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # the tool's failure is an answer (a control signal too)
        return raised(exc)
    if isinstance(value, Accepted):
        # Built unchecked: the wire's limits are checked where the reply becomes bytes.
        return _reply(request, ok=True, accepted=ToolAccepted.model_construct(
            provider_id=value.provider_id, correlation_id=value.correlation_id,
            timeout=value.timeout))
    return _reply(request, ok=True, result=value)


def _reply(request: ToolRequest, **fields: Any) -> ToolReply:
    """A reply to ``request``, addressed (one model built, not two: this is every call's
    path). An in-process key may be longer than the wire allows: then addressed unchecked."""
    try:
        return ToolReply(correlation_id=request.correlation_id,
                         idempotency_key=request.idempotency_key, **fields)
    except ValidationError:
        return addressed(ToolReply(correlation_id="-", **fields), request)


def failure(code: str, message: str) -> ToolReply:
    """A failed reply (its correlation id and key are the request's, set when sent)."""
    return ToolReply(correlation_id="-", ok=False,
                     error=ToolReplyError(code=code, message=message[:4000]))


class RaisedReply(ToolReply):
    """A failed reply that keeps the exception it was made from, for a caller in the
    worker's own process (the node's local worker hands replies over as objects). Its
    bytes, if it is ever sent, are a plain reply's: the ``error`` is the answer there."""

    _raised: BaseException = PrivateAttr()


def raised(exc: BaseException) -> ToolReply:
    """The failed reply for ``exc``, which it keeps (for a caller in this process)."""
    reply = RaisedReply(correlation_id="-", ok=False, error=error_of_exception(exc))
    reply._raised = exc
    return reply


def addressed(reply: ToolReply, request: ToolRequest) -> ToolReply:
    """``reply`` answering ``request``: its correlation id and idempotency key echoed."""
    return reply.model_copy(update={"correlation_id": request.correlation_id,
                                    "idempotency_key": request.idempotency_key})


def wire_reply(reply: ToolReply) -> ToolReply:
    """``reply`` as wire data: its result model dumped (secrets in clear: the node seals
    them) and every field checked against the reply's limits.

    Raises:
        pydantic.ValidationError: a field the wire cannot carry (an ``Accepted`` timeout
            beyond 30 days, an id too long)."""
    data = reply.model_dump(mode="python", exclude={"result"})
    result = reply.result
    data["result"] = revealed(dump_model(result)) if isinstance(result, BaseModel) else result
    return ToolReply.model_validate(data)
