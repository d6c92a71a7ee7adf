"""Loop detection for every node of a graph: the policy a workflow declares.

    wf = Workflow("poll.order", loops=NodeLoops(repeat=3, on_loop={"check": "give_up"}))

A node on a cycle of the graph (or a loop node with ``until``) that leaves the task's state exactly as
it found it, visit after visit, is spinning: each time it completes, the runtime
fingerprints ``(node, digest of the state it saw, digest of what it changed)``. The
``repeat``-th identical fingerprint records ``node.loop_suspected`` (the intervention:
subscribers and operators see it); the next identical one records ``node.loop_detected``
and the task goes along ``on_loop[node]`` when the workflow routes that node, else fails
with LOOP_DETECTED. A cycle whose nodes change the state (a counter, a new page) never
repeats a fingerprint: progress is not a loop. The runtime is
``actors/task/node_guard.py``; docs/workflows.md, "Loop detection".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ratchet.actors.workflow.cycles import cycles
from ratchet.actors.workflow.loop_node import LoopNode
from ratchet.actors.workflow.nodes import FAIL, Node
from ratchet.protocol.errors import WorkflowDefinitionError

__all__ = ["NodeLoops", "check_node_loops"]


@dataclass(frozen=True)
class NodeLoops:
    """Thresholds of node loop detection (the defaults hold when a workflow names none).

    Args:
        repeat: identical fingerprints of one node before the intervention (>= 2); the
            next identical one is the loop. None: no detection for this workflow.
        on_loop: where a node's loop goes (node name → target node, or ``FAIL``); a node
            not named fails the task with LOOP_DETECTED.
    """

    repeat: int | None = 3
    on_loop: Mapping[str, str] = field(default_factory=dict)


def check_node_loops(policy: NodeLoops, nodes: Mapping[str, Node], where: str,
                     found: list[list[str]] | None = None) -> frozenset[str]:
    """Validate ``policy`` against the graph; returns the nodes it watches: those on a
    cycle (the only ones a task can visit twice), but counted loop nodes. ``found``: the
    graph's cycles when the caller has them already (``cycles(nodes)``).

    Raises:
        WorkflowDefinitionError: a threshold out of range, a route naming an unknown node.
    """
    if policy.repeat is not None and (not isinstance(policy.repeat, int) or policy.repeat < 2):
        raise WorkflowDefinitionError(f"{where}: loops.repeat must be an int >= 2 or None")
    for node, target in policy.on_loop.items():
        if node not in nodes or (target != FAIL and target not in nodes):
            raise WorkflowDefinitionError(
                f"{where}: loops.on_loop {node!r} -> {target!r} names an unknown node")
    if policy.repeat is None:
        return frozenset()
    # A loop node is its own cycle (not one of the graph's); without ``until`` it runs its
    # count by design: its iterations are progress.
    on_cycles = {name for component in (cycles(nodes) if found is None else found)
                 for name in component}
    loops = {n.name: n.until is not None for n in nodes.values() if isinstance(n, LoopNode)}
    return frozenset(n for n in on_cycles | set(loops) if loops.get(n, True))
