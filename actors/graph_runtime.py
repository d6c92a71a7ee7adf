"""How a task actor runs the non-step nodes of its graph: conditional edges, routing
tables, fan-out/fan-in, approvals and external waits, and the timers and mail that end them.

Functions over a :class:`actors.task_actor.TaskActor`; each runs in the task actor's own
asyncio task. Every move is a checkpoint along a declared edge (``TaskActor.move``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratchet.actors.fanout import (
    DEFAULT_BRANCH_CONCURRENCY,
    BranchActor,
    BranchDone,
    JoinActor,
    JoinDone,
    JoinTimeout,
    ResendVerdict,
    branch_done_change,
    branch_timer,
    branch_timer_id,
)
from ratchet.actors.nodes import (
    CANCEL,
    FAIL,
    AgentNode,
    ApprovalNode,
    ChoiceNode,
    FanoutNode,
    JoinNode,
    Node,
    RouteNode,
    StepNode,
    WaitNode,
)
from ratchet.persistence.graph_rows import ApprovalWrite, BranchWrites
from ratchet.persistence.ledger import TimerWrite
from ratchet.protocol.codec import canonical
from ratchet.protocol.errors import IllegalTransition, InvalidMessage, RatchetError
from ratchet.protocol.ids import new_id, request_hash
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import TaskEvent, TaskStatus

if TYPE_CHECKING:
    from ratchet.actors.task_actor import TaskActor

__all__ = ["JoinDone", "TIMER_KINDS", "run_node", "on_join_done", "on_branch_done",
           "on_decision", "on_timer", "on_wait_resolved", "stop_fanout_children"]

TIMER_KINDS = frozenset({"approval_timeout", "wait_timeout", "branch_timeout", "join_timeout"})


async def run_node(actor: TaskActor, node: Node) -> bool:
    """Run the task's current node; True when the task moved on and can continue now."""
    if isinstance(node, StepNode):
        return await actor.run_step(node)
    if isinstance(node, ChoiceNode):
        return await _choose(actor, node)
    if isinstance(node, RouteNode):
        try:
            key = node.key(actor.state)
            target = node.table.get(key)  # an unhashable key raises here, inside the guard
        except Exception as exc:
            from ratchet.actors.task_waits import fail_with_saga

            await fail_with_saga(actor, exc, f"routing key of {node.name} raised")
            return False
        used_default = target is None
        await actor.move(node.name, target or node.default or "", [("route.taken", {
            "node": node.name, "key": repr(key)[:200], "to": target or node.default,
            "default_used": used_default})])
        return True
    if isinstance(node, FanoutNode):
        await start_fanout(actor, node)
        return False
    if isinstance(node, ApprovalNode):
        await request_approval(actor, node)
        return False
    if isinstance(node, WaitNode):
        await wait_external(actor, node)
        return False
    if isinstance(node, AgentNode):
        from ratchet.actors.agent_runtime import run_agent

        return await run_agent(actor, node)
    assert isinstance(node, JoinNode)
    raise IllegalTransition(f"join {node.name} is entered only through its fan-out",
                            node=node.name)


async def _choose(actor: TaskActor, node: ChoiceNode) -> bool:
    from ratchet.actors.task_waits import fail_with_saga

    try:
        target = node.guard(actor.state)
    except Exception as exc:
        await fail_with_saga(actor, exc, f"guard of {node.name} raised")
        return False
    if target not in node.targets:
        error = IllegalTransition(f"guard of {node.name} chose {target!r}, not one of its"
                                  f" declared targets {list(node.targets)}", node=node.name)
        await fail_with_saga(actor, error, "guard chose an undeclared target")
        return False
    await actor.move(node.name, target, [("edge.taken", {"node": node.name, "to": target})])
    return True


# -- fan-out / fan-in ------------------------------------------------------------------------

def _fanout_key(actor: TaskActor, node: str) -> str:
    # A fan-out inside a bounded loop runs once per visit: its branches are keyed by visit.
    return f"{node}#{actor.visits.get(node, 0)}"


async def start_fanout(actor: TaskActor, node: FanoutNode) -> None:
    assert actor.record is not None and actor.workflow is not None
    key = _fanout_key(actor, node.name)
    join = actor.workflow.node(node.join)
    assert isinstance(join, JoinNode)
    names = list(node.branches)
    # Evaluated before anything is recorded: a raising branch_input leaves no branch rows.
    inputs: dict[str, dict[str, Any]] = {}
    try:
        for b in names:
            value = node.branch_input(actor.state, b) if node.branch_input else {}
            if not isinstance(value, dict):
                raise TypeError(f"branch_input must return a dict, got {type(value).__name__}")
            inputs[b] = value
    except Exception as exc:
        from ratchet.actors.task_waits import fail_with_saga

        await fail_with_saga(actor, exc, f"branch_input of {node.name} raised")
        return
    rows = await actor.deps.store.branches(actor.task_id, key)
    now = actor.deps.clock.now()
    limit = node.max_concurrency or DEFAULT_BRANCH_CONCURRENCY
    # A branch's budget counts from when it gets a slot. The first ``limit`` branches get
    # theirs at once, so their timers are armed with the fan-out; each later one (and each
    # one run again after a restart) arms its own when its turn comes.
    armed: set[str] = set()
    if not rows:
        timers = []
        if node.branch_timeout:
            armed = set(names[:limit])
            timers += [branch_timer(actor.task_id, key, node.name, b, now + node.branch_timeout)
                       for b in names[:limit]]
        if join.policy.timeout:
            timers.append(TimerWrite(f"join:{actor.task_id}:{key}", "join_timeout",
                                     now + join.policy.timeout, {"key": key}))
        await actor.commit(branches=BranchWrites(key, start=names), timers=timers,
                           events=[("fanout.started", {"node": node.name, "key": key,
                                                       "branches": names})])
        rows = {b: {"status": "RUNNING"} for b in names}
    fired = await actor.deps.store.timer_fired(f"join:{actor.task_id}:{key}")
    specs: list[tuple[str, Any, float]] = [(f"join:{key}", lambda _: JoinActor(
        task_id=actor.task_id, key=key, node=node.name, policy=join.policy, branches=names,
        store=actor.deps.store, tell_task=actor.deps.tell_task, timer_fired=fired), 5.0)]
    for b in names:
        if rows.get(b, {}).get("status", "RUNNING") != "RUNNING":
            continue  # finished before a crash: never run again
        initial = inputs[b]
        # A branch the join no longer needs is interrupted, not waited for.
        arm = None if b in armed else node.branch_timeout
        specs.append((f"branch:{key}:{b}",
                      _branch_factory(actor, key, node, b, initial, limit, arm), 0.01))
    refs = await actor.deps.spawn_children(actor.task_id, specs)
    actor.joins[key] = refs[0]
    refs[0].tell(ResendVerdict())  # a join that decided before we (re)started says it again


def _branch_factory(actor: TaskActor, key: str, node: FanoutNode, branch: str,
                    initial: dict[str, Any], limit: int, arm_timeout: float | None) -> Any:
    assert actor.record is not None
    tenant, task_input = actor.record.tenant, dict(actor.record.input)

    async def session(name: str) -> Any:
        return await actor.deps.sessions(actor.task_id, tenant, name)

    def make(_: int) -> BranchActor:
        return BranchActor(task_id=actor.task_id, tenant=tenant, key=key, node=node.name,
                           branch=branch, graph=node.branches[branch], task_input=task_input,
                           state=dict(initial), store=actor.deps.store, clock=actor.deps.clock,
                           producer=actor.deps.producer, session=session,
                           switches=actor.deps.switches, max_concurrency=limit,
                           arm_timeout=arm_timeout, partitions=actor.deps.partitions)

    return make


async def on_branch_done(actor: TaskActor, env: Envelope) -> str:
    key = str(env.body.get("key"))
    join = actor.joins.get(key)
    if (join is None or not join.is_alive) and actor.deps.lookup_child is not None:
        join = actor.deps.lookup_child(actor.task_id, f"join:{key}")  # restarted meanwhile
        if join is not None:
            actor.joins[key] = join
    if join is None or not join.is_alive:
        return "no join"  # a join that (re)starts recounts from the store
    join.tell(BranchDone(str(env.body.get("branch")), str(env.body.get("status"))))
    return "forwarded"


async def on_join_done(actor: TaskActor, done: JoinDone) -> None:
    from ratchet.actors.task_actor import Advance
    from ratchet.actors.task_waits import fail_with_saga

    assert actor.workflow is not None
    if actor.current != done.node or _fanout_key(actor, done.node) != done.key:
        return  # a stale verdict (the task moved on)
    fanout = actor.workflow.node(done.node)
    assert isinstance(fanout, FanoutNode)
    join = actor.workflow.node(fanout.join)
    assert isinstance(join, JoinNode)
    v = done.verdict
    summary = {"node": join.name, "key": done.key, "ok": v.ok, "reason": v.reason,
               "succeeded": v.succeeded, "failed": v.failed, "timed_out": v.timed_out,
               "degraded": v.degraded, "cancelled": v.unfinished}
    timers = [branch_timer_id(actor.task_id, done.key, b) for b in fanout.branches]
    timers.append(f"join:{actor.task_id}:{done.key}")
    settle = BranchWrites(done.key, settle={b: "CANCELLED" for b in v.unfinished})
    await actor.deps.stop_children(actor.task_id, [f"join:{done.key}"] + [
        f"branch:{done.key}:{b}" for b in fanout.branches])
    actor.joins.pop(done.key, None)
    if not v.ok:
        await actor.commit(events=[("join.failed", summary)], branches=settle,
                           cancel_timers=timers)
        await fail_with_saga(actor, RatchetError(f"join {join.name} failed: {v.reason}"),
                             "join failed")
        return
    actor.spent = (await actor.deps.store.load_task(actor.task_id)).spent  # branches spent too
    actor.state[join.name] = v.values(done.results, join.policy.defaults)
    actor.visits[join.name] = actor.visits.get(join.name, 0) + 1
    await actor.move(fanout.name, join.next, [("join.completed", summary)], branches=settle,
                     cancel_timers=timers)
    actor.ref.tell(Advance())


async def stop_fanout_children(actor: TaskActor) -> None:
    actor.joins.clear()


# -- suspension: approvals -------------------------------------------------------------------

async def request_approval(actor: TaskActor, node: ApprovalNode) -> None:
    try:
        request = node.request(actor.state) if node.request else {}
    except Exception as exc:
        from ratchet.actors.task_waits import fail_with_saga

        await fail_with_saga(actor, exc, f"approval request of {node.name} raised")
        return
    approval_id = new_id("apr")
    digest = request_hash(canonical(request))
    assert node.timeout is not None
    expires = actor.deps.clock.now() + node.timeout
    await actor.commit(
        status_event=TaskEvent.WAITING_APPROVAL,
        approval=ApprovalWrite(approval_id, "PENDING", insert=True, node=node.name,
                               request=request, request_hash=digest, approvers=node.approvers,
                               expires_at=expires),
        timers=[TimerWrite(f"apr:{approval_id}", "approval_timeout", expires,
                           {"approval_id": approval_id, "node": node.name})],
        events=[("approval.requested", {"node": node.name, "approval_id": approval_id,
                                        "approvers": node.approvers, "request": request,
                                        "request_hash": digest, "expires_at": expires})])
    actor.log.info("task waiting for approval", approval_id=approval_id, node=node.name)
    actor.ref.stop()  # passivate: a parked task costs a row, not a live actor


async def on_decision(actor: TaskActor, env: Envelope) -> str:
    from ratchet.actors.task_actor import Advance

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
    if row["expires_at"] is not None and actor.deps.clock.now() > row["expires_at"]:
        return "expired"
    if body.get("request_hash") not in (None, row["request_hash"]):
        return "request changed"  # the approver saw another request than the one pending
    assert actor.workflow is not None
    node = actor.workflow.node(actor.current)
    assert isinstance(node, ApprovalNode)
    target = node.on_approve if decision == "approve" else node.on_reject
    decided_by = str(body.get("decided_by") or "unknown")
    await actor.move(node.name, target, [("approval.decided", {
        "node": node.name, "approval_id": approval_id, "decision": decision,
        "decided_by": decided_by, "reason": body.get("reason"), "to": target})],
        status_event=TaskEvent.APPROVAL_DECIDED, inbox_message_id=env.message_id,
        cancel_timers=[f"apr:{approval_id}"],
        approval=ApprovalWrite(approval_id, "APPROVED" if decision == "approve" else "REJECTED",
                               decided_by=decided_by, reason=body.get("reason")))
    actor.ref.tell(Advance())
    return "processed"


# -- suspension: external waits ----------------------------------------------------------------

def _wait_timer(actor: TaskActor, node: str) -> str:
    return f"wait:{actor.task_id}:{node}:{actor.visits.get(node, 0)}"


async def wait_external(actor: TaskActor, node: WaitNode) -> None:
    try:
        correlation = node.correlation(actor.state)
    except Exception as exc:
        from ratchet.actors.task_waits import fail_with_saga

        await fail_with_saga(actor, exc, f"correlation of {node.name} raised")
        return
    assert node.timeout is not None
    due = actor.deps.clock.now() + node.timeout
    await actor.commit(
        status_event=TaskEvent.WAITING_EXTERNAL, waits=[(correlation, f"node:{node.name}")],
        timers=[TimerWrite(_wait_timer(actor, node.name), "wait_timeout", due,
                           {"node": node.name, "correlation_id": correlation})],
        events=[("wait.started", {"node": node.name, "correlation_id": correlation,
                                  "timeout_s": node.timeout})])
    actor.ref.stop()


async def on_wait_resolved(actor: TaskActor, env: Envelope) -> str:
    from ratchet.actors.task_actor import Advance

    if actor.status is not TaskStatus.WAITING_EXTERNAL:
        return "late"
    assert actor.workflow is not None
    node = actor.workflow.node(actor.current)
    name = str(env.body.get("wait_kind", "")).removeprefix("node:")
    if not isinstance(node, WaitNode) or node.name != name:
        return "ignored"
    cid = str(env.body.get("correlation_id"))
    if env.body.get("outcome", "completed") != "completed":
        from ratchet.actors.task_waits import fail_with_saga

        await actor.commit(status_event=TaskEvent.EXTERNAL_RESOLVED, resolve_waits=[cid],
                           cancel_timers=[_wait_timer(actor, node.name)],
                           inbox_message_id=env.message_id, events=[("wait.completed", {
                               "node": node.name, "correlation_id": cid,
                               "outcome": env.body.get("outcome"), "to": "FAILED"})])
        await fail_with_saga(actor, RatchetError(
            f"{node.name}: the awaited party reported {env.body.get('outcome')!r}",
            error=env.body.get("error")), "external party reported failure")
        return "processed"
    actor.state[node.name] = env.body.get("result")
    await actor.move(node.name, node.next, [("wait.completed", {
        "node": node.name, "correlation_id": cid, "to": node.next})],
        status_event=TaskEvent.EXTERNAL_RESOLVED, resolve_waits=[cid],
        cancel_timers=[_wait_timer(actor, node.name)], inbox_message_id=env.message_id)
    actor.ref.tell(Advance())
    return "processed"


# -- timers ------------------------------------------------------------------------------------

async def on_timer(actor: TaskActor, env: Envelope) -> str:
    from ratchet.actors.task_actor import Advance
    from ratchet.actors.task_waits import fail_with_saga

    kind, payload = env.body.get("kind"), dict(env.body.get("payload") or {})
    assert actor.workflow is not None and actor.record is not None
    if kind in ("branch_timeout", "join_timeout") and "key" not in payload:
        return "ignored"  # not a timer of ours
    if kind == "branch_timeout":
        if "branch" not in payload or "node" not in payload:
            return "ignored"
        key, branch = str(payload["key"]), str(payload["branch"])
        change = branch_done_change(actor.task_id, key, str(payload["node"]), branch, "TIMED_OUT",
                                    {"key": key, "reason": "branch timeout"},
                                    actor.deps.producer, actor.deps.clock.now(),
                                    actor.deps.partitions)
        if await actor.deps.store.finish_branch(change, key, branch, "TIMED_OUT", None,
                                                {"type": "Timeout", "message": "branch timeout"}):
            await actor.deps.stop_children(actor.task_id, [f"branch:{key}:{branch}"])
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
                                   ("approval.timed_out", {"node": node.name, "then": "cancel",
                                                           "approval_id": row["approval_id"]}),
                                   ("task.cancelled", {"reason": "approval timed out"})])
            actor.ref.stop()
            return "processed"
        target = str(node.on_timeout)
        await actor.move(node.name, target, [("approval.timed_out", {
            "node": node.name, "approval_id": row["approval_id"], "escalated_to": target})],
            status_event=TaskEvent.APPROVAL_TIMED_OUT, approval=settle,
            inbox_message_id=env.message_id)
        actor.ref.tell(Advance())
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
                               inbox_message_id=env.message_id, events=[("wait.timed_out", {
                                   "node": node.name, "correlation_id": cid, "to": "FAILED"})])
            await fail_with_saga(actor, RatchetError(f"no message for {node.name} in time"),
                                 "external wait timed out")
            return "processed"
        target = str(node.on_timeout)
        await actor.move(node.name, target, [("wait.timed_out", {
            "node": node.name, "correlation_id": cid, "to": target})],
            status_event=TaskEvent.EXTERNAL_RESOLVED, resolve_waits=[cid],
            inbox_message_id=env.message_id)
        actor.ref.tell(Advance())
        return "processed"
    return "ignored"
