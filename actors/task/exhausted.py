"""A step (or an agent node) that declares ``on_exhausted="human"``: when its last allowed
attempt fails — or an agent's answer is still invalid after its repairs — the task goes to
a human instead of failing.

In one transaction: the task WAITING_APPROVAL, a pending approval at the pseudo-node
:data:`EXHAUSTED_NODE` (bound to the hash of what is asked: the node, the attempt and the
last error), ``approval.requested``, ``task.handoff`` and the handoff package
(actors/task/handoff_package.py). Then the human:

- ``approve``: the node runs once more from the last checkpoint (a step: one more attempt,
  its completed calls answered by the ledger; an agent: its repairs start afresh). If it
  fails again, it comes back here.
- ``reject``: the task fails, compensating first, as it would have without a human.
- ``skip-step`` (a step declared ``skippable``; actors/task/settle.py): it moves on.

A call whose retries (or deadline) ran out on retryable errors (``ActionFailed`` with
``exhausted``) goes to the human too, its key in the request: approved, the call is made
once more under the same key (the action PENDING again). Failures for good (a call's
error that is never retried, a budget, an invalid state value) still fail the task at
once: no attempt of the step can change them.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.effects.signals import HandoffRequired
from ratchet.actors.task.decision_audit import decision_entry
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.pseudo_approvals import pending_decision
from ratchet.actors.task.suspension import fail_with_saga, handoff_package
from ratchet.actors.workflow.nodes import HUMAN, StepNode
from ratchet.persistence.graph_rows import ApprovalWrite
from ratchet.persistence.ledger import ActionWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.codec import canonical
from ratchet.protocol.errors import ActionFailed, RatchetError
from ratchet.protocol.ids import new_id, request_hash
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent

__all__ = ["EXHAUSTED", "EXHAUSTED_NODE", "give_up", "on_exhausted_decision", "to_a_human"]

#: The ``node`` of an exhausted step's approval row (no graph node starts with ``@``).
EXHAUSTED_NODE = "@exhausted"
#: The ``kind`` of its request, handoff package and decision.
EXHAUSTED = "exhausted"


async def give_up(actor: TaskKernel, step: StepNode, exc: BaseException, for_good: str | None,
                  attempt: int) -> None:
    """A step's failure that ends its attempts: a failure for good fails the task; a last
    attempt fails it too, unless the step goes to a human."""
    reason = for_good or f"step {step.name} failed {attempt} times"
    # A call whose retries ran out counts as exhausted too: another try later may succeed.
    exhausted = for_good is None or (isinstance(exc, ActionFailed) and exc.exhausted)
    if exhausted and step.attempts_exhausted == HUMAN:
        await to_a_human(actor, step.name, exc, reason, attempt=attempt,
                         skippable=step.skippable)
        return
    await fail_with_saga(actor, exc, reason)


async def to_a_human(actor: TaskKernel, node: str, exc: BaseException, reason: str, *,
                     attempt: int | None = None, skippable: bool = False) -> None:
    """Hand the task to a human at ``node`` (see the module doc), then passivate."""
    approval_id = new_id("apr")
    error = {"type": type(exc).__name__, "message": str(exc)[:2000],
             **({"code": exc.code.value} if isinstance(exc, RatchetError) else {})}
    request = {"kind": EXHAUSTED, "node": node, "attempt": attempt, "error": error}
    again = "approve: run the node once more from the last checkpoint"
    if isinstance(exc, ActionFailed) and exc.exhausted and exc.details.get("key"):
        request["action"] = str(exc.details["key"])  # approved: sent again under its key
        again += f"; its failed call {request['action']} is made once more under the same key"
    digest = request_hash(canonical(request))
    options = [again, "reject: end the task FAILED (completed side effects are compensated)"]
    if skippable:
        options.append("skip-step: go on to the step's next node without it")
    package = await handoff_package(actor, HandoffRequired(reason, {
        "why": reason, "kind": EXHAUSTED, "approval_id": approval_id, "request_hash": digest,
        "error": error, "skippable": skippable, "options": options}, approval=True))
    await actor.commit(
        status_event=TaskEvent.WAITING_APPROVAL, handoff=(reason, package),
        approval=ApprovalWrite(approval_id, "PENDING", insert=True, node=EXHAUSTED_NODE,
                               request=request, request_hash=digest),
        events=[(EventType.APPROVAL_REQUESTED, {"node": EXHAUSTED_NODE,
                                                "approval_id": approval_id, "request": request,
                                                "request_hash": digest, "approvers": "",
                                                "expires_at": None}),
                (EventType.TASK_HANDOFF, {"reason": reason, "why": reason, "key": None,
                                          "approval_id": approval_id, "node": node})])
    actor.log.warning("attempts exhausted: task handed to a human", node=node, reason=reason)
    actor.passivate()


async def on_exhausted_decision(actor: TaskKernel, env: Envelope) -> str | None:
    """A human's decision on an exhausted node; None when the approval is not one."""
    decided = await pending_decision(actor, env, EXHAUSTED_NODE)
    if decided is None or isinstance(decided, str):
        return decided
    await actor.commit(
        status_event=TaskEvent.APPROVAL_DECIDED, approval=decided.settle,
        inbox_message_id=env.message_id, audit=decision_entry(actor, env, "applied", EXHAUSTED),
        action=await _call_again(actor, decided) if decided.approved else None,
        events=[(EventType.APPROVAL_DECIDED, decided.payload(EXHAUSTED, actor.current))])
    if decided.approved:
        actor.advance()
        return "processed"
    reason = f"{actor.current}: a human rejected another attempt"
    cause: Any = RatchetError(reason, decided_by=decided.decided_by)
    await fail_with_saga(actor, cause, reason)
    return "processed"


async def _call_again(actor: TaskKernel, decided: Any) -> ActionWrite | None:
    """The failed call of an approved exhausted step, PENDING again for one more attempt
    under its key (its retries ran out on errors that were retryable: the provider never
    did it); None when the step's failure was not a call's."""
    key = (decided.row.get("request") or {}).get("action")
    if not key:
        return None
    assert actor.record is not None
    row = await actor.deps.store.get_action(actor.record.tenant, str(key))
    if row is None or row.status != "FAILED":
        return None
    return ActionWrite(row.key, "PENDING", attempts=row.attempts + 1)
