"""The edges of a graph's nodes, as ``ratchet graph``'s transition table and Mermaid diagram
show them."""

from __future__ import annotations

from ratchet.actors.workflow.loop_node import LoopNode, loop_edges
from ratchet.actors.workflow.map_node import MapNode, map_edges
from ratchet.actors.workflow.nodes import (
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
from ratchet.actors.workflow.sleep import SleepNode

__all__ = ["node_edges"]


def node_edges(node: Node) -> list[tuple[str, str]]:
    """The edges leaving ``node``: ``(condition, target)``, a task outcome (FAILED,
    CANCELLED) as the target where no node is."""
    if isinstance(node, LoopNode):  # before StepNode: a loop is a step that repeats
        return loop_edges(node)
    if isinstance(node, MapNode):
        return map_edges(node)
    if isinstance(node, StepNode):
        return [("done", node.next)]
    if isinstance(node, SleepNode):
        return [(node.edge_label(), node.next)]
    if isinstance(node, ChoiceNode):
        return [(f"guard = {t}", t) for t in node.targets]
    if isinstance(node, RouteNode):
        return [(f"key = {k!r}", t) for k, t in node.table.items()] + [("default", node.default or "")]
    if isinstance(node, FanoutNode):
        return [(f"{len(node.branches)} branches joined", node.join)]
    if isinstance(node, JoinNode):
        return [(f"policy {node.policy.mode} met", node.next), ("policy failed", "FAILED")]
    if isinstance(node, ApprovalNode):
        timeout_to = "CANCELLED" if node.on_timeout == CANCEL else str(node.on_timeout)
        return [("approved", node.on_approve), ("rejected", node.on_reject),
                (f"no decision in {node.timeout:g}s", timeout_to)]
    if isinstance(node, AgentNode):
        def to(target: str) -> str:
            return "FAILED" if target == FAIL else target

        edges = [("answer validated", node.next),
                 ("budget exhausted", to(node.on_budget_exhausted)),
                 ("loop detected", to(node.on_loop))]
        if node.degrade is not None:
            edges.append(("no model answered", to(node.degrade.on_exhausted)))
        return edges
    if isinstance(node, WaitNode):
        timeout_to = "FAILED" if node.on_timeout == FAIL else str(node.on_timeout)
        return [("message arrived", node.next), (f"no message in {node.timeout:g}s", timeout_to)]
    return []
