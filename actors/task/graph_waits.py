"""How a task actor runs the nodes that park its task until something from outside
ends the wait: approvals (a decision, or its timeout) and external waits (the awaited
message, or its timeout); and the timers of the graph, fan-out branch and join timeouts
included (``TIMER_KINDS``).

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`), run in the task actor's
own asyncio task; ``actors/task/graph_runtime.py`` starts these nodes and re-exports the mail handlers.
"""

from __future__ import annotations

from ratchet.actors.task.branch_place import stop_branches
from ratchet.actors.task.decision_audit import APPROVAL, decision_entry
from ratchet.actors.task.fanout import JoinTimeout, branch_settlement
from ratchet.actors.task.fanout_run import join_notifier
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import fail_with_saga, is_open_wait
from ratchet.actors.workflow.nodes import CANCEL, FAIL, ApprovalNode, WaitNode
from ratchet.persistence.graph_rows import ApprovalWrite
from ratchet.persistence.ledger import TimerWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import InvalidMessage, RatchetError
from ratchet.protocol.ids import new_id, request_hash
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus

__all__ = ["TIMER_KINDS", "request_approval", "on_decision", "wait_external",
           "on_wait_resolved", "on_timer"]

TIMER_KINDS = frozenset({"approval_timeout", "wait_timeout", "branch_timeout", "join_timeout"})


# -- suspension: approvals -------------------------------------------------------------------

async def request_approval(actor: TaskKernel, node: ApprovalNode) -> None:
    try:
        request = node.request(actor.state) if node.request else {}
    except Exception as exc:
        await fail_with_saga(actor, exc, f"approval request of {node.name} raised")
        return
    approval_id = new_id("apr")
    # A secret in the request is shown redacted; its hash is of the sealed form.
    digest = request_hash(actor.deps.store.secrets.canonical(request))
    assert node.timeout is not None
    expires = actor.deps.clock.now() + node.timeout
    await actor.commit(
        status_event=TaskEvent.WAITING_APPROVAL,
        approval=ApprovalWrite(approval_id, "PENDING", insert=True, node=node.name,
                               request=request, request_hash=digest, approvers=node.approvers,
                               expires_at=expires),
        timers=[TimerWrite(f"apr:{approval_id}", "approval_timeout", expires,
                           {"approval_id": approval_id, "node": node.name})],
        events=[(EventType.APPROVAL_REQUESTED, {"node": node.name, "approval_id": approval_id,
                                        "approvers": node.approvers, "request": request,
                                        "request_hash": digest, "expires_at": expires})])
    actor.log.info("task waiting for approval", approval_id=approval_id, node=node.name)
    actor.passivate()  # passivate: a parked task costs a row, not a live actor


async def on_decision(actor: TaskKernel, env: Envelope) -> str:
    body = env.body
    approval_id = str(body.get("approval_id", ""))
    decision = body.get("decision")
    if decision not in ("approve", "reject"):
        raise InvalidMessage("decision must be 'approve' or 'reject'", decision=decision)
    if actor.status is not TaskStatus.WAITING_APPROVAL:
        return "late"
    row = await actor.deps.store.approval(approval_id)
    if row is None or row["task_id"] != actor.task_id or row["node"] != actor.current:
        return "unknown approval"
    if row["status"] != "PENDING":
        return f"already {row['status'].lower()}"  # one-time: a repeat changes nothing
    if row["expires_at"] is not None and actor.deps.clock.due_now() > row["expires_at"]:
        return "expired"
    if body.get("request_hash") not in (None, row["request_hash"]):
        return "request changed"  # the approver saw another request than the one pending
    assert actor.workflow is not None
    node = actor.workflow.node(actor.current)
    assert isinstance(node, ApprovalNode)
    target = node.on_approve if decision == "approve" else node.on_reject
    decided_by = str(body.get("decided_by") or "unknown")
    await actor.move(node.name, target, [(EventType.APPROVAL_DECIDED, {
        "node": node.name, "approval_id": approval_id, "decision": decision,
        "decided_by": decided_by, "reason": body.get("reason"), "to": target})],
        status_event=TaskEvent.APPROVAL_DECIDED, inbox_message_id=env.message_id,
        cancel_timers=[f"apr:{approval_id}"],
        audit=decision_entry(actor, env, "applied", APPROVAL),  # in the decision's commit
        approval=ApprovalWrite(approval_id, "APPROVED" if decision == "approve" else "REJECTED",
                               decided_by=decided_by, reason=body.get("reason")))
    actor.advance()
    return "processed"


# -- suspension: external waits ----------------------------------------------------------------

def _wait_timer(actor: TaskKernel, node: str) -> str:
    return f"wait:{actor.task_id}:{node}:{actor.visits.get(node, 0)}"


async def wait_external(actor: TaskKernel, node: WaitNode) -> None:
    try:
        correlation = node.correlation(actor.state)
    except Exception as exc:
        await fail_with_saga(actor, exc, f"correlation of {node.name} raised")
        return
    assert node.timeout is not None
    due = actor.deps.clock.now() + node.timeout
    await actor.commit(
        status_event=TaskEvent.WAITING_EXTERNAL, waits=[(correlation, f"node:{node.name}")],
        timers=[TimerWrite(_wait_timer(actor, node.name), "wait_timeout", due,
                           {"node": node.name, "correlation_id": correlation})],
        events=[(EventType.WAIT_STARTED, {"node": node.name, "correlation_id": correlation,
                                  "timeout_s": node.timeout})])
    actor.passivate()


async def on_wait_resolved(actor: TaskKernel, env: Envelope) -> str:
    if actor.status is not TaskStatus.WAITING_EXTERNAL:
        return "late"
    assert actor.workflow is not None
    node = actor.workflow.node(actor.current)
    name = str(env.body.get("wait_kind", "")).removeprefix("node:")
    if not isinstance(node, WaitNode) or node.name != name:
        return "ignored"
    cid = str(env.body.get("correlation_id"))
    if not await is_open_wait(actor, cid, f"node:{node.name}"):
        return "ignored"  # another wait's (or nobody's) correlation id: never this one's
    if env.body.get("outcome", "completed") != "completed":
        await actor.commit(status_event=TaskEvent.EXTERNAL_RESOLVED, resolve_waits=[cid],
                           cancel_timers=[_wait_timer(actor, node.name)],
                           inbox_message_id=env.message_id, events=[(EventType.WAIT_COMPLETED, {
                               "node": node.name, "correlation_id": cid,
                               "outcome": env.body.get("outcome"), "to": "FAILED"})])
        await fail_with_saga(actor, RatchetError(
            f"{node.name}: the awaited party reported {env.body.get('outcome')!r}",
            error=env.body.get("error")), "external party reported failure")
        return "processed"
    actor.state[node.name] = env.body.get("result")
    await actor.move(node.name, node.next, [(EventType.WAIT_COMPLETED, {
        "node": node.name, "correlation_id": cid, "to": node.next})],
        status_event=TaskEvent.EXTERNAL_RESOLVED, resolve_waits=[cid],
        cancel_timers=[_wait_timer(actor, node.name)], inbox_message_id=env.message_id)
    actor.advance()
    return "processed"


# -- timers ------------------------------------------------------------------------------------

async def on_timer(actor: TaskKernel, env: Envelope) -> str:
    kind, payload = env.body.get("kind"), dict(env.body.get("payload") or {})
    assert actor.workflow is not None and actor.record is not None
    if kind in ("branch_timeout", "join_timeout") and "key" not in payload:
        return "ignored"  # not a timer of ours
    if kind == "branch_timeout":
        if "branch" not in payload or "node" not in payload:
            return "ignored"
        key, branch = str(payload["key"]), str(payload["branch"])
        timed_out = branch_settlement(str(payload["node"]), branch, "TIMED_OUT",
                                      {"key": key, "reason": "branch timeout"},
                                      error={"type": "Timeout", "message": "branch timeout"})
        if await actor.deps.store.finish_branches(actor.task_id, key, actor.deps.producer,
                                                  actor.deps.clock.now(), [timed_out]):
            join_notifier(actor, key)({branch: "TIMED_OUT"}, {branch: None})
            # Settled as timed out: its run, wherever it is, is moot.
            await stop_branches(actor, key, only=[branch])
        return "processed"
    if kind == "join_timeout":
        join = actor.joins.get(str(payload["key"]))
        if join is not None and join.is_alive:
            join.tell(JoinTimeout())
        return "processed"  # a join started later sees its fired timer in the store
    node = actor.workflow.nodes.get(actor.current)
    if kind == "approval_timeout":
        if actor.status is not TaskStatus.WAITING_APPROVAL or not isinstance(node, ApprovalNode):
            return "late"
        row = await actor.deps.store.approval(str(payload.get("approval_id", "")))
        if row is None or row["status"] != "PENDING":
            return "late"
        settle = ApprovalWrite(row["approval_id"], "TIMED_OUT", reason="no decision in time")
        if node.on_timeout == CANCEL:
            await actor.commit(status_event=TaskEvent.CANCELLED, approval=settle,
                               inbox_message_id=env.message_id, events=[
                                   (EventType.APPROVAL_TIMED_OUT, {"node": node.name, "then": "cancel",
                                                           "approval_id": row["approval_id"]}),
                                   (EventType.TASK_CANCELLED, {"reason": "approval timed out"})])
            actor.passivate()
            return "processed"
        target = str(node.on_timeout)
        await actor.move(node.name, target, [(EventType.APPROVAL_TIMED_OUT, {
            "node": node.name, "approval_id": row["approval_id"], "escalated_to": target})],
            status_event=TaskEvent.APPROVAL_TIMED_OUT, approval=settle,
            inbox_message_id=env.message_id)
        actor.advance()
        return "processed"
    if kind == "wait_timeout":
        if actor.status is not TaskStatus.WAITING_EXTERNAL or not isinstance(node, WaitNode):
            return "late"
        if env.body.get("timer_id") != _wait_timer(actor, node.name):
            return "late"  # an earlier wait's (or visit's) timer: not this wait's business
        cid = str(payload.get("correlation_id"))
        if node.on_timeout == FAIL:
            # Back to RUNNING first: the saga may need to hand a failed undo to a human.
            await actor.commit(status_event=TaskEvent.EXTERNAL_RESOLVED, resolve_waits=[cid],
                               inbox_message_id=env.message_id, events=[(EventType.WAIT_TIMED_OUT, {
                                   "node": node.name, "correlation_id": cid, "to": "FAILED"})])
            await fail_with_saga(actor, RatchetError(f"no message for {node.name} in time"),
                                 "external wait timed out")
            return "processed"
        target = str(node.on_timeout)
        await actor.move(node.name, target, [(EventType.WAIT_TIMED_OUT, {
            "node": node.name, "correlation_id": cid, "to": target})],
            status_event=TaskEvent.EXTERNAL_RESOLVED, resolve_waits=[cid],
            inbox_message_id=env.message_id)
        actor.advance()
        return "processed"
    return "ignored"
