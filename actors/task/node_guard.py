"""Loop detection for every node (the policy: actors/workflow/node_loops.py).

Each time a watched node (on a cycle of the graph, or a loop node) completes, the actor's
``move`` hands the guard its fingerprint: ``(node, digest of the state the node saw,
digest of what it changed)``. Both digests come with the state tracker for free
(``StateTracker.seen`` and ``digest``: 64-bit xors of per-key hashes, updated from what
each checkpoint writes), so a watched commit costs a tuple and a counter, and a node off
every cycle costs one set lookup.

The ``repeat``-th identical fingerprint of a node adds ``node.loop_suspected`` to the
commit (the intervention, once per node); the next identical one adds
``node.loop_detected`` and either routes the move to the workflow's ``on_loop`` target
for that node or leaves a :class:`LoopDetected` in ``failure``, which the graph runtime
(``run_node``) acts on before running the next node (so the event and the move that proved
the loop are committed first, and the saga runs from a clean boundary).

Counts live with the actor: a task recovered on another actor starts counting again, so
a loop is then found at most ``repeat`` + 1 rounds later (``max_visits`` bounds every
cycle regardless). Why not persist them: a write per watched commit, for a rare event.
"""

from __future__ import annotations

from collections import Counter

from ratchet.actors.workflow.nodes import FAIL
from ratchet.actors.workflow.registry import Workflow
from ratchet.persistence.checkpoints import StateTracker
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import LoopDetected

__all__ = ["NodeGuard"]

Events = list[tuple[str, dict[str, object]]]


class NodeGuard:
    """One task actor's node fingerprints, and the loop it found, if any."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, int, int]] = Counter()
        self._intervened: set[str] = set()
        #: A loop found on a node with no ``on_loop`` route: the task fails next.
        self.failure: LoopDetected | None = None

    def observe(self, workflow: Workflow | None, node: str, to: str, events: Events,
                tracker: StateTracker) -> str:
        """Count the move from ``node`` to ``to`` about to commit (its state already
        diffed by ``tracker``); returns where it goes (``on_loop`` when routed), having
        appended the guard's event, if any, to ``events``."""
        if workflow is None or node not in workflow.looping_nodes:
            return to
        repeat = workflow.loops.repeat
        assert repeat is not None  # no watched nodes without it
        fingerprint = (node, tracker.seen, tracker.seen ^ tracker.digest)
        self._counts[fingerprint] += 1
        times = self._counts[fingerprint]
        if times < repeat or (times == repeat and node in self._intervened):
            return to
        evidence: dict[str, object] = {
            "node": node, "times": times, "input_digest": f"{fingerprint[1]:016x}",
            "output_digest": f"{fingerprint[2]:016x}", "changed": fingerprint[2] != 0}
        if node not in self._intervened:
            self._intervened.add(node)
            events.append((EventType.NODE_LOOP_SUSPECTED, {**evidence, "next": to}))
            return to
        route = workflow.loops.on_loop.get(node, FAIL)
        events.append((EventType.NODE_LOOP_DETECTED, {**evidence, "to": route}))
        # A routed loop starts afresh: the route may well lead back here with new state.
        for key in [k for k in self._counts if k[0] == node]:
            del self._counts[key]
        self._intervened.discard(node)
        if route != FAIL:
            return route
        self.failure = LoopDetected(f"node {node} repeats without progress ({times} times)",
                                    node=node, pattern="no_progress", times=times)
        return to
