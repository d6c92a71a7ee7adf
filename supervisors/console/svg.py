"""A workflow's graph as inline SVG, with the task's current node highlighted.

Drawn here rather than with Mermaid: the console must work without network access and
without vendoring a JavaScript bundle. Layout: each node on the row of its shortest
distance from the start (breadth first), nodes of a row side by side; an edge that goes
back up (a loop) is drawn as a curve on the right, one within a row as a curve below it.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

__all__ = ["graph_svg"]

_W, _H, _GAP_X, _GAP_Y, _PAD = 170, 36, 30, 62, 20
_END = "END"


def _rows(start: str, edges: list[tuple[str, str, str]]) -> dict[str, int]:
    """Each node's row: its breadth-first distance from ``start``."""
    row = {start: 0}
    frontier = [start]
    while frontier:
        nxt = []
        for name in frontier:
            for src, _, dst in edges:
                if src == name and dst not in row:
                    row[dst] = row[name] + 1
                    nxt.append(dst)
        frontier = nxt
    for src, _, dst in edges:  # not reachable from the start (should not be): at the end
        for name in (src, dst):
            row.setdefault(name, max(row.values()) + 1)
    return row


def _positions(row: dict[str, int]) -> tuple[dict[str, tuple[int, int]], int, int]:
    by_row: dict[int, list[str]] = {}
    for name, r in sorted(row.items(), key=lambda kv: kv[1]):
        by_row.setdefault(r, []).append(name)
    widest = max(len(names) for names in by_row.values())
    width = _PAD * 2 + widest * _W + (widest - 1) * _GAP_X + 60  # room for loop curves
    pos = {}
    for r, names in by_row.items():
        span = len(names) * _W + (len(names) - 1) * _GAP_X
        left = (width - 60 - span) // 2
        for i, name in enumerate(names):
            pos[name] = (left + i * (_W + _GAP_X), _PAD + r * (_H + _GAP_Y))
    height = _PAD * 2 + (max(by_row) + 1) * (_H + _GAP_Y) - _GAP_Y
    return pos, width, height


def _edge(src: tuple[int, int], dst: tuple[int, int], cond: str, width: int) -> str:
    (x1, y1), (x2, y2) = src, dst
    label = escape(cond if len(cond) <= 24 else cond[:23] + "…")
    if y2 > y1:  # downwards
        ax, ay, bx, by = x1 + _W // 2, y1 + _H, x2 + _W // 2, y2
        path = f"M{ax},{ay} L{bx},{by}"
        lx, ly = (ax + bx) // 2 + 4, (ay + by) // 2
    elif y2 == y1:  # within a row: a curve below the two nodes
        ax, bx, ay = x1 + _W // 2, x2 + _W // 2, y1 + _H
        mid = (ax + bx) // 2
        path = f"M{ax},{ay} Q{mid},{ay + 40} {bx},{ay}"
        lx, ly = mid - 20, ay + 30
    else:  # a loop back: around the right
        ax, ay, bx, by = x1 + _W, y1 + _H // 2, x2 + _W, y2 + _H // 2
        bend = width - 15
        path = f"M{ax},{ay} C{bend},{ay} {bend},{by} {bx},{by}"
        lx, ly = bend - 40, (ay + by) // 2
    return (f'<path class="edge" d="{path}" marker-end="url(#arrow)"/>'
            f'<text class="cond" x="{lx}" y="{ly}">{label}</text>')


def graph_svg(start: str, kinds: Mapping[str, str], table: list[tuple[str, str, str, str]],
              current: str | None, visits: Mapping[str, Any] | None = None) -> str:
    """The SVG of a graph: ``kinds`` node → kind, ``table`` the workflow's transition table
    (``from, kind, condition, to``); ``current`` drawn highlighted, visited nodes shaded."""
    edges = [(src, cond, dst) for src, _, cond, dst in table]
    row = _rows(start, edges)
    for name in kinds:
        row.setdefault(name, max(row.values()) + 1)
    pos, width, height = _positions(row)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}"'
           f' height="{height}" viewBox="0 0 {width} {height}" role="img"'
           ' aria-label="workflow graph">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"'
           ' markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/>'
           '</marker></defs>']
    out.extend(_edge(pos[src], pos[dst], cond, width) for src, cond, dst in edges)
    for name, (x, y) in pos.items():
        kind = kinds.get(name, "end" if name == _END else "outcome")
        cls = "node current" if name == current else (
            "node visited" if visits and visits.get(name) else "node")
        rx = 18 if kind in ("end", "outcome", "approval", "wait") else 4
        out.append(f'<g class="{cls}" data-node="{escape(name)}"><rect x="{x}" y="{y}"'
                   f' width="{_W}" height="{_H}" rx="{rx}"/><text x="{x + _W // 2}"'
                   f' y="{y + 15}" text-anchor="middle">{escape(name)}</text><text'
                   f' class="kind" x="{x + _W // 2}" y="{y + 29}" text-anchor="middle">'
                   f'{escape(kind)}</text></g>')
    out.append("</svg>")
    return "".join(out)
