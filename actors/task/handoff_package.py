"""The handoff package: everything a human needs to take over a task a machine could not
finish, built when the task is handed over — by its actor (actors/task/suspension.py), or
from the store when its supervisor gave up (``fail_task``, actors/task/deps.py) — and
stored with the handoff row (secrets redacted when packed).

It holds the signal's own fields (``why``, ``key``, ``options``, ...) and: ``tenant``,
``task_id``, ``workflow`` and ``workflow_version``, ``node`` (where the task stands),
``reason``; ``goal``, ``timeline``, ``last_checkpoint``; ``actions`` (every ledger row: state,
request and its digest, the recorded provider response or error, provider and correlation
ids); ``effective`` (writes that took effect and are not undone) and ``compensable`` (those
whose tool declares an undo); ``budget`` and ``spent``; ``last_errors``; ``asked`` (every
approval the task asked for: who, when, what became of it); and ``recommended`` — one next
action, with the admin command that does it (:func:`recommend`, a pure function).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ratchet.actors.workflow.registry import Registry
from ratchet.persistence.ledger import ActionRecord
from ratchet.persistence.ports import TaskStore
from ratchet.persistence.records import TaskRecord
from ratchet.protocol.catalogue import EventType

__all__ = ["Where", "build_package", "recommend"]

#: Events whose payload carries an error worth showing a human.
_ERROR_EVENTS = (EventType.STEP_FAILED, EventType.ACTION_FAILED, EventType.ACTION_UNKNOWN,
                 EventType.ACTION_RETRY, EventType.BRANCH_FAILED, EventType.JOIN_FAILED)
_LAST_ERRORS = 5


def recommend(task_id: str, package: dict[str, Any], actions: list[dict[str, Any]],
              ) -> dict[str, Any]:
    """The next action a human should take, from the package and the ledger rows shown:
    settle the first write of unknown outcome, else decide the pending approval, else undo
    by hand what a failed compensation (or a supervisor that gave up) left, then resolve it
    compensated, else cancel."""
    doubt = [a for a in actions if a["status"] in ("UNKNOWN", "IN_FLIGHT", "PENDING")
             and a["compensates"] is None]
    if doubt:
        a = doubt[0]
        where = f" (provider id {a['provider_id']})" if a["provider_id"] else ""
        return {"verb": "resolve", "action": a["key"], "request_hash": a["request_hash"],
                "why": f"ask the provider of {a['tool']} whether {a['key']}{where} took"
                       " effect; resolve it with what they say, or retry-action if they"
                       " have no record of it",
                "command": f"ratchet admin resolve {task_id} --action {a['key']} --outcome"
                           f" succeeded|failed --request-hash {a['request_hash']}"
                           " --evidence '...'"}
    if package.get("approval_id"):
        return {"verb": "approve", "approval_id": package["approval_id"],
                "why": "decide the pending approval: " + "; ".join(package.get("options", [])),
                "command": f"ratchet admin approve {task_id} --arg approval_id="
                           f"{package['approval_id']} --request-hash"
                           f" {package.get('request_hash')}"}
    undo = [a for a in actions if a["compensates"] is not None and a["status"] != "SUCCEEDED"]
    pending = [a for a in actions if a["key"] in package.get("pending_compensations", ())]
    if undo or pending:
        original = pending[0] if pending and not undo else next(
            (a for a in actions if a["key"] == undo[0]["compensates"]), undo[0])
        return {"verb": "resolve", "action": original["key"],
                "request_hash": original["request_hash"],
                "why": f"undo {original['tool']} {original['key']} by hand (no compensation"
                       " did), then resolve it compensated: the task goes on failing and"
                       " undoes the rest",
                "command": f"ratchet admin resolve {task_id} --action {original['key']}"
                           f" --outcome compensated --request-hash {original['request_hash']}"
                           " --evidence '...'"}
    return {"verb": "cancel", "why": "nothing left to settle: cancel the task",
            "command": f"ratchet admin cancel {task_id}"}


def _correlations(events: list[dict[str, Any]]) -> dict[str, str]:
    """Each accepted action's correlation id (recorded on ``action.accepted``)."""
    out: dict[str, str] = {}
    for e in events:
        payload = e["payload"] or {}
        if e["type"] == EventType.ACTION_ACCEPTED and payload.get("correlation_id"):
            out[str(payload.get("key"))] = str(payload["correlation_id"])
    return out


def _shown(a: ActionRecord, correlation: str | None) -> dict[str, Any]:
    return {"key": a.key, "tool": a.tool, "status": a.status, "provider_id": a.provider_id,
            "correlation_id": correlation, "attempts": a.attempts, "accepted": a.accepted,
            "request": a.args, "request_hash": a.request_hash,
            # A model call's answer is in the agent log, and may be long: not repeated here.
            "response": None if a.kind == "model" else a.result,
            "error": a.error, "compensates": a.compensates, "step_index": a.step_index}


def _compensable(registry: Registry, effective: list[ActionRecord]) -> list[str]:
    out = []
    for a in effective:
        try:
            tool = registry.tool(a.tool)
        except Exception:  # model calls and unregistered tools declare no undo
            continue
        if tool.compensate is not None:
            out.append(a.key)
    return out


@dataclass(frozen=True)
class Where:
    """Where the task stands, as whoever hands it over knows it: its live actor, or — when
    the supervisor gave up — the store's row alone."""

    node: str | None
    next_step: int
    state_keys: list[str]
    spent: dict[str, float]
    now: float


async def build_package(store: TaskStore, registry: Registry, rec: TaskRecord, where: Where,
                        reason: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The package of a handoff for ``reason`` with the signal's own ``fields`` (see the
    module doc)."""
    events = await store.events(rec.task_id)
    actions = await store.task_actions(rec.task_id)
    correlations = _correlations(events)
    shown = [_shown(a, correlations.get(a.key)) for a in actions]
    effective = [a for a in actions if a.status == "SUCCEEDED" and a.compensates is None]
    errors = [{"sequence": e["sequence"], "type": e["type"], "at": e["occurred_at"],
               "error": (e["payload"] or {}).get("error")} for e in events
              if e["type"] in _ERROR_EVENTS][-_LAST_ERRORS:]
    asked = [{"approval_id": r["approval_id"], "node": r["node"],
              "approvers": r["approvers"] or "any approver of the tenant",
              "asked_at": r["created_at"], "expires_at": r["expires_at"],
              "status": r["status"], "decided_by": r["decided_by"]}
             for r in await store.task_approvals(rec.task_id)]
    if fields.get("approval_id") and not any(
            r["approval_id"] == fields["approval_id"] for r in asked):
        asked.append({"approval_id": fields["approval_id"], "node": where.node,
                      "approvers": "any approver of the tenant", "asked_at": where.now,
                      "expires_at": None, "status": "PENDING", "decided_by": None})
    package = {
        **fields,
        "tenant": rec.tenant, "task_id": rec.task_id, "workflow": rec.workflow,
        "workflow_version": rec.workflow_version, "node": where.node, "reason": reason,
        "goal": {"workflow": rec.workflow, "input": rec.input},
        "timeline": [{"sequence": e["sequence"], "type": e["type"], "at": e["occurred_at"],
                      "payload": e["payload"]} for e in events[-50:]],
        "last_checkpoint": {"seq": rec.last_checkpoint, "next_step": where.next_step,
                            "state_keys": where.state_keys},
        "actions": shown,
        "effective": [a.key for a in effective],
        "compensable": _compensable(registry, effective),
        "budget": rec.budget, "spent": dict(where.spent),
        "last_errors": errors, "asked": asked,
    }
    package["recommended"] = recommend(rec.task_id, package, shown)
    return package
