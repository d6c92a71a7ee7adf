"""The package's import graph, checked on the source: no function-local imports (the usual
way to hide a cycle), and no cycle among the modules, ``TYPE_CHECKING`` imports included.

And the rooms inside a layer: each imports only itself and the rooms of lower tiers;
rooms of one tier are independent. (The layer rule itself — protocol ← persistence ←
actors ← supervisors — is checked by ``tests/test_packaging.py``.)
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

FOLDERS = ["protocol", "persistence", "actors", "supervisors", "ratchet/testing"]

#: The function-local imports, none of which dodges a cycle (their edges are in the graph
#: checked below all the same): ``ratchet demo`` loads the test components (simulators,
#: the demo app), which a serving node must not carry; and what a start does not need is
#: loaded at its first use — each CLI command its own module, the OpenTelemetry SDK when
#: traces are on, an agent node's modules at the first agent node a task runs, the metrics
#: port's and the console's HTTP server when asked for, rich's rendering for people when
#: they read the output, the children a node starts after its tasks resumed (imported on a
#: thread meanwhile), pykka at the first blocking tool call (docs/operations.md, "Restart
#: (W4)").
LAZY = {("supervisors/cli/__init__.py", "ratchet.testing.demo"),
        *(("supervisors/cli/__init__.py", f"ratchet.supervisors.cli.{command}")
          for command in ("serve", "tasks", "admin", "schedule", "replay", "versions",
                          "tool_worker")),
        ("supervisors/cli/__init__.py", "ratchet.supervisors.cli"),
        ("supervisors/cli/serve.py", "ratchet.supervisors.node.otel"),
        ("supervisors/cli/serve.py", "ratchet.supervisors.console"),
        ("supervisors/cli/output.py", "ratchet.supervisors.cli.human"),
        ("supervisors/node/start_order.py", "ratchet.supervisors.node.later_children"),
        ("actors/effects/tool_session.py", "ratchet.actors.effects.blocking_runner"),
        ("supervisors/cli/serve_health.py", "ratchet.supervisors.observability.http"),
        ("protocol/tracing.py", "ratchet.protocol.spans"),
        ("actors/task/graph_runtime.py", "ratchet.actors.task.agent_node")}

#: The rooms of each layer by tier, lowest first (docs/architecture.md, "Floor plan").
ROOMS = {
    "actors": [{"core"}, {"workflow", "transport"}, {"effects", "agents"}, {"task"}, {"replay"}],
    "supervisors": [{"supervision"}, {"services"}, {"node"}, {"observability"}, {"console"},
                    {"cli"}],
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "ratchet"]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["ratchet", *parts])


def _modules() -> dict[str, Path]:
    found = {_module_name(p): p for f in FOLDERS for p in (ROOT / f).rglob("*.py")}
    found["ratchet"] = ROOT / "ratchet" / "__init__.py"
    return found


def _imported(node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    """The package's modules an import statement names (``from m import sub`` may name a
    sub-module as well as ``m`` itself)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        names = [base, *(f"{base}.{a.name}" for a in node.names)]
    return {n for n in names if n in known}


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    known = _modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    local: list[str] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        top_level = {id(n) for n in tree.body} | {
            id(n) for stmt in tree.body if isinstance(stmt, ast.If) for n in stmt.body}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = _imported(node, known)
            where = str(path.relative_to(ROOT))
            if targets and id(node) not in top_level \
                    and not all((where, t) in LAZY for t in targets):
                local.append(f"{where}:{node.lineno}")
            edges[name] |= targets - {name}
    return edges, local


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_the_package_inside_a_function() -> None:
    _, local = _graph()
    assert local == []


def test_no_import_cycle_among_the_packages_modules() -> None:
    edges, _ = _graph()
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above is not trivially true."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges, _ = _graph()
    assert len(edges) > 90 and sum(map(len, edges.values())) > 300


def _tier(layer: str, room: str) -> int:
    return next(i for i, rooms in enumerate(ROOMS[layer]) if room in rooms)


def _room_violations(edges: dict[str, set[str]]) -> list[str]:
    """Imports from a room to another room of the same layer that is not below it."""
    broken = []
    for importer, imported in edges.items():
        parts = importer.split(".")
        if len(parts) < 3 or parts[1] not in ROOMS:
            continue
        for target in imported:
            other = target.split(".")
            if len(other) < 3 or other[1] != parts[1] or other[2] == parts[2]:
                continue
            if _tier(parts[1], other[2]) >= _tier(parts[1], parts[2]):
                broken.append(f"{importer} imports {target}")
    return sorted(broken)


def test_every_module_of_a_layer_lives_in_a_room() -> None:
    for layer, tiers in ROOMS.items():
        rooms = set().union(*tiers)
        found = {p.name.removesuffix(".py") for p in (ROOT / layer).iterdir()
                 if p.name != "__init__.py" and p.name != "__pycache__"}
        assert found == rooms, layer


def test_each_room_imports_only_itself_and_the_rooms_below() -> None:
    edges, _ = _graph()
    assert _room_violations(edges) == []
    # Not vacuous: an upward or sideways import is caught.
    assert _room_violations({
        "ratchet.actors.core.actor": {"ratchet.actors.task.actor"},
        "ratchet.actors.effects.saga": {"ratchet.actors.agents.models"},
        "ratchet.actors.task.actor": {"ratchet.actors.core.actor"},
    }) == ["ratchet.actors.core.actor imports ratchet.actors.task.actor",
           "ratchet.actors.effects.saga imports ratchet.actors.agents.models"]
