"""A human settles what a machine could not: the task side of the admin verbs ``resolve``,
``retry-action`` and ``skip-step`` (supervisors/services/admin_settle.py), delivered as an
in-process ``task.settle`` mail to the task's actor, which checks again what the admin
service checked (its status, the action, the request hash) under its single writer.

- ``resolve``: the action's outcome is what the human found at the provider — SUCCEEDED
  (with its ``result``, validated against the tool's result model), FAILED, or COMPENSATED
  (undone by hand) — recorded with ``action.human_resolved`` and the evidence.
- ``retry-action``: the action goes PENDING; when the task runs again its step calls the
  provider once more under the same idempotency key.
- ``skip-step``: the task moves past its current step (declared ``skippable``) to the
  step's next node, with ``step.skipped``; nothing of the step is committed.

Then the task goes on as :func:`continuation` says: while other writes of unknown outcome
remain, or an approval is pending, it stays where it is; a failure that stopped for a human
(unresolved writes at failure, a failed undo) goes on failing — compensating the rest; a
cancel whose undo failed goes on cancelling; any
other handoff runs the step again from its checkpoint, where the ledger answers the settled
call (a FAILED or COMPENSATED action raises ``ActionFailed`` in the step: the workflow
decides, else the task fails compensating). Answers are ``processed: <then>`` or
``refused:<CODE>: <why>`` (an error code of protocol/errors.py, for the admin's reply).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ratchet.actors.task import control as task_control
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import fail_with_saga
from ratchet.actors.workflow.nodes import StepNode
from ratchet.persistence.admin_rows import AuditEntry
from ratchet.persistence.graph_rows import ApprovalWrite
from ratchet.persistence.ledger import ActionRecord, ActionWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.messages import Envelope
from ratchet.protocol.redaction import dump_model, has_secrets
from ratchet.protocol.states import TaskEvent, TaskStatus

__all__ = ["OUTCOMES", "continuation", "on_settle"]

#: The outcomes a human may record, by the action's status now. A FAILED compensation may
#: have been done after all (by hand); a SUCCEEDED write may have been undone by hand.
OUTCOMES: dict[str, tuple[str, ...]] = {
    "UNKNOWN": ("succeeded", "failed", "compensated"),
    "IN_FLIGHT": ("succeeded", "failed", "compensated"),
    "PENDING": ("succeeded", "failed", "compensated"),
    "FAILED": ("succeeded",),  # compensations only (checked below)
    "SUCCEEDED": ("compensated",),  # not a compensation (checked below)
}
#: Handoffs whose task was failing when it stopped: settled, it goes on failing.
_FAILING = ("unresolved actions at failure", "compensation failed for good",
            "compensation accepted but not confirmed")
_WAITING = (TaskStatus.UNKNOWN, TaskStatus.WAITING_APPROVAL)


def in_doubt(actions: list[ActionRecord]) -> list[str]:
    """Writes whose outcome no one knows yet (accepted ones included: their confirmation
    may never have come)."""
    return [a.key for a in actions if a.status in ("UNKNOWN", "IN_FLIGHT")
            and a.compensates is None]


def continuation(package: dict[str, Any], doubts: list[str], approval_pending: bool) -> str:
    """What the task does once a human settled an action, from its open handoff's package:
    ``wait`` (still waiting for a human), ``cancel`` (it was being cancelled when an undo
    failed: the cancel goes on), ``fail`` (it was failing: it goes on failing) or ``run``
    (its step again)."""
    if doubts or approval_pending:
        return "wait"
    if "cancel" in package:
        return "cancel"
    failing = package.get("why") in _FAILING or "failure" in package \
        or "pending_compensations" in package
    return "fail" if failing else "run"


async def on_settle(actor: TaskKernel, env: Envelope) -> str:
    body = env.body
    if actor.status not in _WAITING:
        return f"refused:ILLEGAL_TRANSITION: the task is {actor.status.value}, not waiting" \
               " for a human"
    handoffs = [h for h in await actor.deps.store.handoffs(actor.task_id)
                if h["resolved_at"] is None]
    if not handoffs:
        return "refused:ILLEGAL_TRANSITION: the task has no open handoff (an approval node:" \
               " approve or reject it)"
    package = handoffs[-1]["package"] or {}
    verb = body.get("verb")
    if verb == "skip-step":
        return await _skip(actor, env)
    assert actor.record is not None
    row = await actor.deps.store.get_action(actor.record.tenant, str(body.get("key")))
    if row is None or row.task_id != actor.task_id:
        return "refused:NOT_FOUND: no such action of this task"
    if body.get("request_hash") != row.request_hash:
        return "refused:CONFLICT: the action's request hash is not the one named"
    write = _write(actor, row, body) if verb == "resolve" else _resend(row)
    if isinstance(write, str):
        return write
    by = str(body.get("by") or "unknown")
    event = {"key": row.key, "tool": row.tool, "from": row.status, "outcome": body.get(
        "outcome", "resend"), "evidence": body.get("evidence"), "by": by,
        "request_hash": row.request_hash, "command_id": env.correlation_id}
    doubts = [k for k in in_doubt(await actor.deps.store.task_actions(actor.task_id))
              if k != row.key]  # the settled one is no longer in doubt
    pending = await _pending(actor)
    then = "run" if verb == "retry-action" and not doubts and pending is None else \
        continuation(package, doubts, pending is not None)
    events: list[tuple[str, dict[str, Any]]] = [(EventType.ACTION_HUMAN_RESOLVED,
                                                 {**event, "then": then})]
    audit = _entry(actor, env, {**event, "then": then})
    if then == "wait":
        await actor.commit(action=write, events=events, inbox_message_id=env.message_id,
                           audit=audit)
        return f"processed: the task still waits for {_waiting_for(doubts, pending)}"
    events.append((EventType.TASK_HUMAN_RESOLVED, {"by": by, "key": row.key, "then": then}))
    await actor.commit(status_event=TaskEvent.HUMAN_RESOLVED, action=write, events=events,
                       inbox_message_id=env.message_id, audit=audit)
    if then == "cancel":
        await task_control.cancel(actor, dict(package["cancel"] or {}))
        return "processed: the cancel goes on (compensating what is left)"
    if then == "fail":
        failure = package.get("failure") or {}
        reason = str(failure.get("message") or package.get("why") or "settled by a human")
        await fail_with_saga(actor, RatchetError(reason, settled_by=by), reason)
        return "processed: the task goes on failing (compensating what is left)"
    actor.advance()
    return "processed: the task runs its step again from its last checkpoint"


def _entry(actor: TaskKernel, env: Envelope, detail: dict[str, Any]) -> AuditEntry:
    """The audit entry committed with the settlement (as an applied decision's is): the
    admin service audits the command too, before and after."""
    assert actor.record is not None
    return AuditEntry(actor.record.tenant, actor.deps.clock.now(),
                      str(env.body.get("by") or "unknown"), str(env.body.get("verb")),
                      env.message_id, actor.task_id, "applied",
                      {"kind": "human_resolution", **detail})


async def _pending(actor: TaskKernel) -> dict[str, Any] | None:
    """The task's pending approval (a pseudo-node's: an approval node is not a handoff)."""
    rows = await actor.deps.store.task_approvals(actor.task_id)
    return next((r for r in reversed(rows) if r["status"] == "PENDING"), None)


def _waiting_for(doubts: list[str], pending: dict[str, Any] | None) -> str:
    if doubts:
        return f"its other writes of unknown outcome: {doubts[:10]}"
    assert pending is not None
    return f"a decision on approval {pending['approval_id']}"


def _write(actor: TaskKernel, row: ActionRecord, body: dict[str, Any]) -> ActionWrite | str:
    outcome = body.get("outcome")
    if outcome not in OUTCOMES.get(row.status, ()) \
            or (row.status == "FAILED" and row.compensates is None) \
            or (row.status == "SUCCEEDED" and row.compensates is not None):
        return f"refused:ILLEGAL_TRANSITION: a {row.status} action cannot be resolved" \
               f" {outcome}"
    evidence = {"message": f"resolved by a human: {body.get('evidence')}",
                "code": "HUMAN_RESOLVED", "type": "HumanResolution"}
    if outcome == "failed":
        return ActionWrite(row.key, "FAILED", error=evidence)
    if outcome == "compensated":
        return ActionWrite(row.key, "COMPENSATED", error=evidence)
    result: Any = body.get("result") or {}
    try:
        tool = actor.deps.registry.tool(row.tool)
    except Exception:  # not registered here: kept as given
        return ActionWrite(row.key, "SUCCEEDED", result=result,
                           provider_id=body.get("provider_id"))
    try:
        model = tool.result.model_validate(result)
    except ValidationError as exc:
        return f"refused:INVALID_ARGUMENT: the result does not fit {tool.name}'s result" \
               f" model: {exc.errors()[:3]}"
    kept = dump_model(model)
    if has_secrets(type(model)):
        kept = actor.deps.store.secrets.seal_leaves(kept)
    provider_id = body.get("provider_id") or getattr(model, "provider_id", None)
    return ActionWrite(row.key, "SUCCEEDED", result=kept, provider_id=provider_id)


def _resend(row: ActionRecord) -> ActionWrite | str:
    if row.status not in ("UNKNOWN", "IN_FLIGHT") or row.accepted or row.compensates:
        return f"refused:ILLEGAL_TRANSITION: only a write of unknown outcome that the" \
               f" provider did not accept can be re-sent (this one is {row.status}" \
               f"{', accepted' if row.accepted else ''})"
    return ActionWrite(row.key, "PENDING", attempts=row.attempts + 1)


async def _skip(actor: TaskKernel, env: Envelope) -> str:
    assert actor.workflow is not None
    node = actor.workflow.nodes.get(actor.current)
    if not isinstance(node, StepNode) or not node.skippable:
        return f"refused:ILLEGAL_TRANSITION: {actor.current} is not a step the workflow" \
               " declares skippable"
    doubts = in_doubt(await actor.deps.store.task_actions(actor.task_id))
    if doubts:
        return f"refused:ILLEGAL_TRANSITION: resolve its writes of unknown outcome first:" \
               f" {doubts[:10]}"
    by = str(env.body.get("by") or "unknown")
    pending = await _pending(actor)
    settle = None if pending is None else ApprovalWrite(
        pending["approval_id"], "SKIPPED", decided_by=by, reason="step skipped")
    skipped = {"step": node.name, "next": node.next, "by": by,
               "reason": env.body.get("reason"), "command_id": env.correlation_id}
    await actor.move(node.name, node.next, [(EventType.STEP_SKIPPED, skipped)],
                     count_visit=False, status_event=TaskEvent.HUMAN_RESOLVED,
                     approval=settle, inbox_message_id=env.message_id,
                     audit=_entry(actor, env, skipped))
    actor.advance()
    return f"processed: the task goes on at {node.next}"
