"""Sagas: when a task fails after side effects, undo them in reverse order.

Each compensation is itself an action under the ledger protocol (its own idempotency key,
recorded, reconciled), so running the saga twice — after a crash mid-compensation —
compensates each action once. A compensation that fails for good ends in a human handoff,
never in silence.
"""

from __future__ import annotations

from typing import Any

import structlog

from ratchet.actors.effects.actions import ActionRunner, HandoffRequired
from ratchet.actors.workflow.registry import Registry
from ratchet.persistence.ledger import ActionRecord, ActionWrite
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import ActionFailed

__all__ = ["compensate_task", "pending_compensations"]

log = structlog.get_logger("ratchet.saga")


async def pending_compensations(store: TaskStore, registry: Registry, task_id: str,
                                actions: list[ActionRecord] | None = None) -> list[ActionRecord]:
    """Succeeded writes of the task that declare a compensation, newest first. ``actions``:
    the task's ledger rows when the caller has just read them (saves a second read)."""
    if actions is None:
        actions = await store.task_actions(task_id)
    out = []
    for action in reversed(actions):
        if action.status != "SUCCEEDED" or action.compensates is not None:
            continue
        try:
            tool = registry.tool(action.tool)
        except Exception:  # model calls and unregistered tools declare no compensation
            log.debug("no registered tool for action", task_id=task_id, key=action.key)
            continue
        if tool.compensate is not None:
            out.append(action)
    return out


async def compensate_task(runner: ActionRunner, store: TaskStore, registry: Registry,
                          task_id: str, actions: list[ActionRecord] | None = None) -> list[str]:
    """Compensate every pending action in reverse order; returns the keys compensated.
    ``actions``: as for :func:`pending_compensations`.

    Raises:
        HandoffRequired: a compensation failed for good or could not be reconciled.
    """
    done: list[str] = []
    for action in await pending_compensations(store, registry, task_id, actions):
        tool = registry.tool(action.tool)
        assert tool.compensate is not None
        original_args = tool.args.model_validate(action.args)
        original_result = tool.result.model_validate(action.result)
        comp_args = tool.compensate.args(original_args, original_result)
        try:
            await runner.call(tool.compensate.tool, comp_args, compensates=action.key)
        except ActionFailed as exc:
            raise HandoffRequired("a compensation failed", {
                "why": "compensation failed for good",
                "action": _describe(action),
                "compensation": tool.compensate.tool.name,
                "error": exc.to_wire(),
                "compensated_before": done,
                "options": ["compensate by hand, then mark the task FAILED",
                            "retry the compensation", "leave the side effect in place"],
            }, approval=True) from exc
        await runner.env.commit(
            action=ActionWrite(action.key, "COMPENSATED"),
            events=[(EventType.ACTION_COMPENSATED, {"key": action.key, "tool": action.tool,
                                                    "by": tool.compensate.tool.name})])
        done.append(action.key)
    return done


def _describe(action: ActionRecord) -> dict[str, Any]:
    return {"key": action.key, "tool": action.tool, "request": action.args,
            "result": action.result, "provider_id": action.provider_id}
