"""How a task actor runs the non-step nodes of its graph: conditional edges, routing
tables, fan-out/fan-in, approvals and external waits, and the timers and mail that end them.
Maps (a fan-out over a list) are ``map_runtime.py``'s, loops ``loop_runtime.py``'s; a fan-out
visit, static or not, starts and ends in ``fanout_run.py``.

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`); each runs in the task
actor's own asyncio task. Every move is a checkpoint along a declared edge (``move``).
Approvals, external waits and timers live in ``actors/task/graph_waits.py``; their mail
handlers are re-exported here.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.task.branch_place import stop_branches
from ratchet.actors.task.branch_window import on_window_moved
from ratchet.actors.task.fanout import BranchDone, JoinDone, WindowMoved
from ratchet.actors.task.fanout_run import Joined, Visit, apply_verdict, fanout_key, start_visit
from ratchet.actors.task.graph_waits import (
    TIMER_KINDS,
    on_decision,
    on_timer,
    on_wait_resolved,
    request_approval,
    wait_external,
)
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.loop_runtime import run_loop
from ratchet.actors.task.map_runtime import on_map_joined, start_map
from ratchet.actors.task.sleep_node import enter_sleep
from ratchet.actors.task.suspension import fail_with_saga
from ratchet.actors.workflow.loop_node import LoopNode
from ratchet.actors.workflow.map_node import MapNode
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
from ratchet.protocol import tracing
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import IllegalTransition
from ratchet.protocol.messages import Envelope
from ratchet.protocol.states import is_terminal

__all__ = ["JoinDone", "TIMER_KINDS", "WindowMoved", "run_node", "on_join_done", "on_branch_done",
           "on_decision", "on_timer", "on_wait_resolved", "stop_fanout_children"]


async def run_node(actor: TaskKernel, node: Node) -> bool:
    """Run the task's current node; True when the task moved on and can continue now.

    When tracing, the node runs in a span of its own (``ratchet.step``), a child of the
    task's trace (protocol/tracing.py): its tool and model calls and the events it commits
    are the span's children and span events."""
    if not tracing.enabled() or actor.record is None or actor.record.traceparent is None:
        return await _run_node(actor, node)  # not tracing, or a task begun untraced
    # Four attributes, no more: each costs a few µs a step to record and export, and a
    # trivial step is ~0.4 ms (bench/tracing.py); the workflow is on the intake span.
    with tracing.span("ratchet.step", {
            "ratchet.task_id": actor.task_id, "ratchet.tenant": actor.record.tenant,
            "ratchet.step": node.name, "ratchet.idempotency_key": actor.record.idempotency_key}):
        return await _run_node(actor, node)


async def _run_node(actor: TaskKernel, node: Node) -> bool:
    if actor.node_guard.failure is not None:  # the last move proved a loop (node_guard.py)
        error, actor.node_guard.failure = actor.node_guard.failure, None
        await fail_with_saga(actor, error, "loop detected")
        return False
    if isinstance(node, LoopNode):  # before StepNode: a loop is a step that repeats
        return await run_loop(actor, node)
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
    if isinstance(node, MapNode):
        await start_map(actor, node)
        return False
    if isinstance(node, ApprovalNode):
        await request_approval(actor, node)
        return False
    if isinstance(node, WaitNode):
        await wait_external(actor, node)
        return False
    if isinstance(node, AgentNode):  # the agent's modules: loaded by the first agent node
        from ratchet.actors.task.agent_node import run_agent

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

async def start_fanout(actor: TaskKernel, node: FanoutNode) -> None:
    key = fanout_key(actor, node.name)
    join = actor.workflow.node(node.join) if actor.workflow is not None else None
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
    await start_visit(actor, Visit(
        key=key, node=node.name, names=names, graph_of=node.branches.__getitem__,
        inputs=inputs, policy=join.policy, branch_timeout=node.branch_timeout,
        max_concurrency=node.max_concurrency, retries=node.branch_retries,
        started={"node": node.name, "key": key, "branches": names},
    ), await actor.deps.store.branches(actor.task_id, key))


async def on_branch_done(actor: TaskKernel, env: Envelope) -> str:
    key = str(env.body.get("key"))
    join = actor.joins.get(key)
    if join is None or not join.is_alive:
        join = actor.deps.children.lookup_child(actor.task_id, f"join:{key}")  # restarted meanwhile
        if join is not None:
            actor.joins[key] = join
    if join is None or not join.is_alive:
        return "no join"  # a join that (re)starts recounts from the store
    statuses = env.body.get("statuses")
    if not isinstance(statuses, dict):  # one branch's notice (a node of an earlier release)
        statuses = {env.body.get("branch"): env.body.get("status")}
    join.tell(BranchDone({str(b): str(s) for b, s in statuses.items()}))
    return "forwarded"


async def on_join_done(actor: TaskKernel, done: JoinDone | WindowMoved) -> None:
    if isinstance(done, WindowMoved):  # not a verdict: the next branches' turn came
        await on_window_moved(actor, done)
        return
    assert actor.workflow is not None
    if actor.current != done.node or fanout_key(actor, done.node) != done.key:
        return  # a stale verdict (the task moved on)
    node = actor.workflow.node(done.node)
    if isinstance(node, MapNode):
        await on_map_joined(actor, node, done)
        return
    assert isinstance(node, FanoutNode)
    join = actor.workflow.node(node.join)
    assert isinstance(join, JoinNode)
    await apply_verdict(actor, done, Joined(
        node=node.name, join=join.name, branches=list(node.branches), into=join.name,
        value=done.verdict.values(done.results, join.policy.defaults), next=join.next))


async def stop_fanout_children(actor: TaskKernel) -> None:
    """The task actor stops. If the task ended (cancelled, failed), its fan-outs' branches
    stop wherever they run; otherwise (it moves to another node, its actor restarts, it
    pauses: its branches were held) they go on, fenced by their own partitions' leases,
    and the task's next start finds them running."""
    keys = list(actor.joins)
    actor.joins.clear()
    if is_terminal(actor.status):
        for key in keys:
            await stop_branches(actor, key)
