"""Settling a write whose outcome nobody recorded: ask the provider (``query``), record
what it says, never send the request again.

A write is left IN_FLIGHT by a crash during its call, or UNKNOWN by a lost answer; the
step that made it settles it only if it calls the same tool again with the same key. A
re-run that takes another path, a step that swallows the error, or a cancel that outlived
the call would leave it so for ever. Recovery, the end of a step, the end of a task and
the action sweeper therefore settle it here (docs/side-effects.md, "Settling"):

- found → SUCCEEDED with the provider's result (``action.reconciled``, ``found: true``);
  found but still pending at the provider → IN_FLIGHT and accepted (the task waits for it);
- not found → PENDING for a task still running (a later call with the key sends it again,
  the provider's idempotency makes that safe), FAILED for a task that has ended (it never
  took effect, and nothing will send it again). "Not found" is believed only once the call
  cannot still be running: ``tool.timeout`` after its IN_FLIGHT commit (a call abandoned by
  a step's timeout goes on on its thread, a request may still be on its way); before that
  the caller waits (``wait_quiet``) or gets YOUNG and looks again later;
- no ``query``, the query failing every try, or an answer outside the contract → undecided:
  the caller hands it to a human.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ratchet.actors.core.backoff import backoff_delay
from ratchet.actors.effects.action_reports import handoff_package
from ratchet.actors.effects.actions import ActionRunner
from ratchet.actors.workflow.registry import Registry
from ratchet.actors.workflow.tools import Accepted, Decision, Tool, classify
from ratchet.persistence.ledger import ActionRecord, ActionWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import RatchetError

__all__ = ["FOUND", "NOT_FOUND", "UNDECIDED", "YOUNG", "registered_tool", "settle_action",
           "undecided_package"]

FOUND, NOT_FOUND, UNDECIDED, YOUNG = "found", "not_found", "undecided", "young"


async def settle_action(runner: ActionRunner, tool: Tool[Any, Any] | None, row: ActionRecord,
                        on: str, *, ended: bool, wait_quiet: bool = True) -> str:
    """Query the provider for ``row`` and record its outcome; returns FOUND, NOT_FOUND,
    UNDECIDED or YOUNG (nothing recorded for these two). ``on``: who settles."""
    if tool is None or tool.query is None or row.request_hash == "":
        return UNDECIDED
    try:
        args = tool.args.model_validate(row.args)
    except ValidationError:
        return UNDECIDED
    decided, answer = await _query(runner, tool, args, row.key)
    quiet_at = row.updated_at + tool.timeout  # the call cannot be running any more
    if decided and answer is None and runner.env.clock.now() < quiet_at:
        if not wait_quiet:
            return YOUNG
        await runner.env.clock.sleep(quiet_at - runner.env.clock.now())
        decided, answer = await _query(runner, tool, args, row.key)
    if not decided:
        return UNDECIDED
    report = {"key": row.key, "tool": row.tool, "on": on}
    if answer is None:
        status, then = ("FAILED", "never took effect") if ended else \
            ("PENDING", "sent again only if a step calls it again")
        await runner.env.commit(
            action=ActionWrite(row.key, status, error={"code": "NOT_FOUND", "message":
                                                       f"not found at the provider ({on})"}
                               if ended else None),
            events=[(EventType.ACTION_RECONCILED, {**report, "found": False, "then": then})])
        return NOT_FOUND
    if isinstance(answer, Accepted):
        await runner.env.commit(
            action=ActionWrite(row.key, "IN_FLIGHT", accepted=True, provider_id=answer.provider_id),
            events=[(EventType.ACTION_RECONCILED, {**report, "found": True, "pending": True,
                                                   "provider_id": answer.provider_id})])
        return FOUND
    try:
        result = tool.result.model_validate(answer) if not isinstance(answer, tool.result) \
            else answer
    except ValidationError:
        return UNDECIDED
    provider_id = getattr(result, "provider_id", None)
    await runner.env.commit(  # kept as the runner keeps a result: its secrets sealed
        action=ActionWrite(row.key, "SUCCEEDED", result=runner._kept(result),
                           provider_id=provider_id),
        events=[(EventType.ACTION_RECONCILED, {**report, "found": True,
                                               "provider_id": provider_id})])
    return FOUND


async def _query(runner: ActionRunner, tool: Tool[Any, Any], args: Any,
                 key: str) -> tuple[bool, Any]:
    """(True, the provider's answer: a result, Accepted or None), or (False, None) after
    the tool's retry budget of failed queries."""
    for attempt in range(1, tool.retry.max_attempts + 1):
        ok, value = await runner.query_once(tool, args, key)
        if ok:
            return True, value
        if classify(value, "read") is Decision.FAIL or attempt == tool.retry.max_attempts:
            break
        await runner.env.clock.sleep(backoff_delay(attempt - 1, tool.retry.base_delay,
                                                   tool.retry.max_delay, runner.env.rng))
    return False, None


def registered_tool(registry: Registry, name: str) -> Tool[Any, Any] | None:
    """The tool a ledger row names, or None if this node does not register it."""
    try:
        return registry.tool(name)
    except RatchetError:
        return None


def undecided_package(tool: Tool[Any, Any] | None, row: ActionRecord, on: str) -> dict[str, Any]:
    """The handoff package of a write nobody could settle by machine."""
    why = "no query declared" if tool is None or tool.query is None else "query undecidable"
    if tool is None:
        return {"why": f"{why}: tool {row.tool!r} not registered", "tool": row.tool,
                "key": row.key, "attempts": row.attempts, "found_by": on}
    try:
        args = tool.args.model_validate(row.args)
    except ValidationError:
        return {"why": why, "tool": row.tool, "key": row.key, "found_by": on}
    return {**handoff_package(tool.name, args, row.key, row.attempts, why), "found_by": on}
