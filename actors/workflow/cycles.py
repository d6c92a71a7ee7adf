"""The cycles of a workflow graph, which each need a loop bound (``max_visits``) on one of
their nodes: strongly connected components found by Tarjan's algorithm, iteratively, so that
a long sequence of thousands of steps does not hit Python's recursion limit."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ratchet.actors.workflow.nodes import END, Node

__all__ = ["cycles"]


def cycles(nodes: Mapping[str, Node]) -> list[list[str]]:
    """The strongly connected components holding a cycle, each as its nodes' names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def successors(v: str) -> list[str]:
        return [w for w in nodes[v].successors() if w != END and w in nodes]

    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[str, Iterator[str]]] = [(root, iter(successors(root)))]
        while work:
            v, pending = work[-1]
            advanced = False
            for w in pending:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(successors(w))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1 or v in nodes[v].successors():
                    out.append(list(reversed(component)))
    return out
