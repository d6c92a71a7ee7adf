"""What the action protocol tells about a call: its result as the tool's model, its error as
a map, a retry event's payload, and the handoff package a human gets when an outcome cannot
be settled by machine."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from ratchet.actors.workflow.tools import Decision, Tool
from ratchet.protocol.errors import ActionFailed, ErrorCode, RatchetError
from ratchet.protocol.redaction import dump_model

__all__ = ["coerce_args", "coerce_result", "error_of", "failed_before", "handoff_package", "retry_payload"]


def coerce_args(tool: Tool[Any, Any], args: Any) -> Any:
    """``args`` as the tool's argument model (a map is validated into it).

    Raises:
        ActionFailed: they do not validate.
    """
    if isinstance(args, tool.args):
        return args
    try:
        return tool.args.model_validate(args)
    except ValidationError as exc:
        raise ActionFailed(f"{tool.name}: invalid arguments: {exc.errors()[:3]}",
                           tool=tool.name) from None


def coerce_result(tool: Tool[Any, Any], value: Any) -> Any:
    """A provider's answer as the tool's result model.

    Raises:
        ActionFailed: it does not validate.
    """
    if isinstance(value, tool.result):
        return value
    try:
        return tool.result.model_validate(value)
    except ValidationError as exc:
        raise ActionFailed(f"{tool.name} returned an invalid result: {exc.errors()[:3]}",
                           tool=tool.name) from None


def error_of(exc: BaseException) -> dict[str, Any]:
    """An exception as the ``error`` member of an event or a ledger row."""
    if isinstance(exc, RatchetError):
        return {**exc.to_wire(), "type": type(exc).__name__}
    return {"code": "UNKNOWN", "message": str(exc)[:2000], "type": type(exc).__name__}


def retry_payload(tool: str, key: str | None, op: str, decision: Decision, exc: BaseException,
                  delay: float, attempt: int, digest: str,
                  task_spent: dict[str, float] | None) -> dict[str, Any]:
    """An ``action.retry`` event: why, when, which request (its digest, the ledger's for a
    write) and what the task has spent so far, so that a retry storm shows in its cost."""
    cost: dict[str, Any] = {"attempts": attempt}
    if task_spent is not None:
        cost["task_spent"] = task_spent
    return {"key": key, "tool": tool, "op": op, "reason": decision.value,
            "error": error_of(exc), "delay_s": round(delay, 4), "attempt": attempt,
            "next_attempt": attempt + 1, "request_digest": digest, "cost_so_far": cost}


def handoff_package(tool: str, args: BaseModel, key: str, attempt: int,
                    why: str) -> dict[str, Any]:
    """What a human needs to settle an action whose outcome is unknown."""
    return {"why": why, "tool": tool, "key": key, "attempts": attempt,
            "request": dump_model(args),  # its secrets redacted with the package
            "options": ["confirm the action happened (mark SUCCEEDED with the provider's"
                        " result)", "confirm it did not happen (resend with the same key)",
                        "fail the task (compensations run)"]}


def failed_before(tool: str, key: str, error: dict[str, Any] | None) -> ActionFailed:
    """The failure a step gets for an action the ledger holds FAILED: the same code (the
    provider's reason), and :attr:`~ActionFailed.exhausted` as it was the first time."""
    error = error or {}
    failure = ActionFailed(f"{tool} failed before: {error.get('message')}", key=key, tool=tool,
                           error=error)
    failure.exhausted = bool(error.get("exhausted"))
    code = str(error.get("code"))
    if code in ErrorCode.__members__:
        failure.code = ErrorCode(code)
    return failure
