"""How a task actor re-validates its plan when it goes on after standing still (the hook:
actors/workflow/revalidate.py).

A task that stood still is always loaded by a fresh actor (a parked task is passivated; a
recovered one is restarted), so the actor notes in ``on_start`` why it stood still
(``TaskKernel.revalidation``, from the status it was loaded in) and, at its first
``Advance`` that runs something — after the decision, message or timer that woke it, after
the recovery is recorded and the deadline checked; not when the task's next move is its
end — asks the workflow's hook once:

- the plan holds: ``plan.revalidated`` (``valid: true``) and the task goes on;
- it does not, with ``on_invalid`` a node: ``plan.revalidated`` (``then: replan``) in the
  checkpointed move to that node, and the task goes on there;
- it does not, with no ``on_invalid``: a handoff for a human in one transaction — the
  task WAITING_APPROVAL, a pending approval at the pseudo-node :data:`REVALIDATE_NODE`,
  ``plan.revalidated`` (``then: human``), ``task.handoff``. Approve: the task goes on
  where it stood, without asking the hook again (the human vouched for the plan); reject:
  it fails, compensating first.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.effects.signals import HandoffRequired, TaskSuspended
from ratchet.actors.task.decision_audit import decision_entry
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.pseudo_approvals import pending_decision
from ratchet.actors.task.suspension import fail_with_saga, handoff_package
from ratchet.actors.workflow.nodes import END
from ratchet.actors.workflow.revalidate import RevalidateContext, verdict_of
from ratchet.persistence.graph_rows import ApprovalWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.codec import canonical
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.ids import new_id, request_hash
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent

__all__ = ["REVALIDATE", "REVALIDATE_NODE", "check_plan", "on_revalidate_decision"]

#: The ``node`` of a failed re-validation's approval row (no graph node starts with ``@``).
REVALIDATE_NODE = "@revalidate"
#: The ``kind`` of its decision (event and audit entry).
REVALIDATE = "revalidate"


async def check_plan(actor: TaskKernel) -> bool:
    """Re-validate once if the task just resumed; True when it goes on (where it stood, or
    at the replan node), False when it went to a human and this actor stops."""
    after, actor.revalidation = actor.revalidation, None
    wf, record = actor.workflow, actor.record
    if after is None or wf is None or record is None or wf.revalidate_hook is None \
            or actor.current == END:  # nothing left to run: no plan to re-validate
        return True
    deps = actor.deps
    ctx = RevalidateContext(
        task_id=actor.task_id, tenant=record.tenant, workflow=wf.name, node=actor.current,
        after=after, parked_s=round(max(0.0, deps.clock.now() - record.updated_at), 3),
        state=dict(actor.state), input=record.input, resources=deps.registry.resources,
        runner=actor.runner(actor.next_step, None))
    try:
        why = await verdict_of(wf.revalidate_hook, ctx)
    except TaskSuspended as signal:  # a check cannot park the task: it did not finish
        why = f"revalidate could not finish: {type(signal).__name__}"
    verdict: dict[str, Any] = {"after": after, "node": actor.current, "parked_s": ctx.parked_s,
                               "valid": why is None, "reason": why}
    if why is None:
        await actor.commit(events=[(EventType.PLAN_REVALIDATED, {**verdict, "then": "continue"})])
        return True
    actor.log.warning("plan no longer valid", after=after, reason=why, replan=wf.on_invalid)
    if wf.on_invalid is not None:
        await actor.move(actor.current, wf.on_invalid, [(EventType.PLAN_REVALIDATED, {
            **verdict, "then": "replan", "to": wf.on_invalid})], count_visit=False)
        return True
    await _to_a_human(actor, verdict, why)
    return False


async def _to_a_human(actor: TaskKernel, verdict: dict[str, Any], why: str) -> None:
    approval_id = new_id("apr")
    request = {"kind": REVALIDATE, "after": verdict["after"], "node": actor.current,
               "reason": why}
    digest = request_hash(canonical(request))
    reason = f"plan no longer valid after {verdict['after']}: {why}"
    package = await handoff_package(actor, HandoffRequired(reason, {
        "why": reason, "kind": REVALIDATE, "approval_id": approval_id, "request_hash": digest,
        "verdict": verdict, "options": [
            "approve: go on at the node where the task stood (the hook is not asked again)",
            "reject: end the task FAILED (completed side effects are compensated)"]},
        approval=True))
    await actor.commit(
        status_event=TaskEvent.WAITING_APPROVAL, handoff=(reason, package),
        approval=ApprovalWrite(approval_id, "PENDING", insert=True, node=REVALIDATE_NODE,
                               request=request, request_hash=digest),
        events=[(EventType.PLAN_REVALIDATED, {**verdict, "then": "human",
                                              "approval_id": approval_id}),
                (EventType.APPROVAL_REQUESTED, {"node": REVALIDATE_NODE,
                                                "approval_id": approval_id, "request": request,
                                                "request_hash": digest, "approvers": "",
                                                "expires_at": None}),
                (EventType.TASK_HANDOFF, {"reason": reason, "why": why,
                                          "approval_id": approval_id})])
    actor.passivate()


async def on_revalidate_decision(actor: TaskKernel, env: Envelope) -> str | None:
    """A human's decision on a failed re-validation; None when the approval is not one."""
    decided = await pending_decision(actor, env, REVALIDATE_NODE)
    if decided is None or isinstance(decided, str):
        return decided
    await actor.commit(
        status_event=TaskEvent.APPROVAL_DECIDED, approval=decided.settle,
        inbox_message_id=env.message_id, audit=decision_entry(actor, env, "applied", REVALIDATE),
        events=[(EventType.APPROVAL_DECIDED, decided.payload(REVALIDATE, actor.current))])
    if decided.approved:
        actor.revalidation = None  # the human vouched for the plan: go on without asking
        actor.advance()
        return "processed"
    reason = "plan no longer valid: a human rejected going on"
    await fail_with_saga(actor, RatchetError(reason, decided_by=decided.decided_by), reason)
    return "processed"
