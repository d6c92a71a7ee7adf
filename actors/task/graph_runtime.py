"""How a task actor runs the non-step nodes of its graph: conditional edges, routing
tables, fan-out/fan-in, approvals and external waits, and the timers and mail that end them.

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`); each runs in the task
actor's own asyncio task. Every move is a checkpoint along a declared edge (``move``).
Approvals, external waits and timers live in ``actors/task/graph_waits.py``; their mail
handlers are re-exported here.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.task.agent_node import run_agent
from ratchet.actors.task.fanout import (
    DEFAULT_BRANCH_CONCURRENCY,
    BranchActor,
    BranchDone,
    JoinActor,
    JoinDone,
    ResendVerdict,
    branch_timer,
    branch_timer_id,
)
from ratchet.actors.task.graph_waits import (
    TIMER_KINDS,
    on_decision,
    on_timer,
    on_wait_resolved,
    request_approval,
    wait_external,
)
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.sleep_node import enter_sleep
from ratchet.actors.task.suspension import fail_with_saga
from ratchet.actors.workflow.nodes import (
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
from ratchet.actors.workflow.sleep import SleepNode
from ratchet.persistence.graph_rows import BranchWrites
from ratchet.persistence.ledger import TimerWrite
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import IllegalTransition, RatchetError
from ratchet.protocol.messages import Envelope

__all__ = ["JoinDone", "TIMER_KINDS", "run_node", "on_join_done", "on_branch_done",
           "on_decision", "on_timer", "on_wait_resolved", "stop_fanout_children"]


async def run_node(actor: TaskKernel, node: Node) -> bool:
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
            await fail_with_saga(actor, exc, f"routing key of {node.name} raised")
            return False
        used_default = target is None
        await actor.move(node.name, target or node.default or "", [(EventType.ROUTE_TAKEN, {
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
        return await run_agent(actor, node)
    if isinstance(node, SleepNode):
        return await enter_sleep(actor, node)
    assert isinstance(node, JoinNode)
    raise IllegalTransition(f"join {node.name} is entered only through its fan-out",
                            node=node.name)


async def _choose(actor: TaskKernel, node: ChoiceNode) -> bool:
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
    await actor.move(node.name, target, [(EventType.EDGE_TAKEN, {"node": node.name, "to": target})])
    return True


# -- fan-out / fan-in ------------------------------------------------------------------------

def _fanout_key(actor: TaskKernel, node: str) -> str:
    # A fan-out inside a bounded loop runs once per visit: its branches are keyed by visit.
    return f"{node}#{actor.visits.get(node, 0)}"


async def start_fanout(actor: TaskKernel, node: FanoutNode) -> None:
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
                           events=[(EventType.FANOUT_STARTED, {"node": node.name, "key": key,
                                                       "branches": names})])
        rows = {b: {"status": "RUNNING"} for b in names}
    fired = await actor.deps.store.timer_fired(f"join:{actor.task_id}:{key}")
    specs: list[tuple[str, Any, float]] = [(f"join:{key}", lambda _: JoinActor(
        task_id=actor.task_id, key=key, node=node.name, policy=join.policy, branches=names,
        store=actor.deps.store, tell_task=actor.deps.children.tell_task, timer_fired=fired), 5.0)]
    for b in names:
        if rows.get(b, {}).get("status", "RUNNING") != "RUNNING":
            continue  # finished before a crash: never run again
        initial = inputs[b]
        # A branch the join no longer needs is interrupted, not waited for.
        arm = None if b in armed else node.branch_timeout
        specs.append((f"branch:{key}:{b}",
                      _branch_factory(actor, key, node, b, initial, limit, arm), 0.01))
    refs = await actor.deps.children.spawn_children(actor.task_id, specs)
    actor.joins[key] = refs[0]
    refs[0].tell(ResendVerdict())  # a join that decided before we (re)started says it again


def _branch_factory(actor: TaskKernel, key: str, node: FanoutNode, branch: str,
                    initial: dict[str, Any], limit: int, arm_timeout: float | None) -> Any:
    assert actor.record is not None
    tenant, task_input = actor.record.tenant, dict(actor.record.input)

    async def session(name: str) -> Any:
        return await actor.deps.children.session(actor.task_id, tenant, name)

    def make(_: int) -> BranchActor:
        return BranchActor(task_id=actor.task_id, tenant=tenant, key=key, node=node.name,
                           branch=branch, graph=node.branches[branch], task_input=task_input,
                           state=dict(initial), store=actor.deps.store, clock=actor.deps.clock,
                           producer=actor.deps.producer, session=session,
                           switches=actor.deps.switches, max_concurrency=limit,
                           arm_timeout=arm_timeout, partitions=actor.deps.partitions)

    return make


async def on_branch_done(actor: TaskKernel, env: Envelope) -> str:
    key = str(env.body.get("key"))
    join = actor.joins.get(key)
    if join is None or not join.is_alive:
        join = actor.deps.children.lookup_child(actor.task_id, f"join:{key}")  # restarted meanwhile
        if join is not None:
            actor.joins[key] = join
    if join is None or not join.is_alive:
        return "no join"  # a join that (re)starts recounts from the store
    join.tell(BranchDone(str(env.body.get("branch")), str(env.body.get("status"))))
    return "forwarded"


async def on_join_done(actor: TaskKernel, done: JoinDone) -> None:
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
    await actor.deps.children.stop_children(actor.task_id, [f"join:{done.key}"] + [
        f"branch:{done.key}:{b}" for b in fanout.branches])
    actor.joins.pop(done.key, None)
    if not v.ok:
        await actor.commit(events=[(EventType.JOIN_FAILED, summary)], branches=settle,
                           cancel_timers=timers)
        await fail_with_saga(actor, RatchetError(f"join {join.name} failed: {v.reason}"),
                             "join failed")
        return
    actor.spent = (await actor.deps.store.load_task(actor.task_id)).spent  # branches spent too
    actor.state[join.name] = v.values(done.results, join.policy.defaults)
    actor.visits[join.name] = actor.visits.get(join.name, 0) + 1
    await actor.move(fanout.name, join.next, [(EventType.JOIN_COMPLETED, summary)], branches=settle,
                     cancel_timers=timers)
    actor.advance()


async def stop_fanout_children(actor: TaskKernel) -> None:
    actor.joins.clear()
