"""What a person sees of an answer: rich renderables built from the very dicts the JSON
output prints.

Nothing here does I/O or reads the clock (``now`` is passed in), so each rendering is
tested without a terminal. The shapes are found, not declared per verb: a list of records
(``tasks``, ``events``, ``keys``, ``nodes``, ``leases``, ``handoffs``, ``problems``) becomes
a table, the rest of a record a field/value table, a supervision ``tree`` a tree. Times
(``at``, ``*_at``, ``last_heartbeat``: epoch seconds) read as "3 s ago"; statuses and event
types are coloured by what they mean. Every value is shown as ``Text``, never parsed as rich
markup: a task's output may hold any characters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ratchet.protocol.catalogue import EventType
from ratchet.protocol.messages import Event
from ratchet.protocol.states import TaskStatus

__all__ = ["event_line", "relative_time", "render_answer", "status_style"]

#: A status's colour: green done, red failed or unsure, yellow stopped by a person,
#: magenta waiting for someone, cyan moving.
_STATUS_STYLES: dict[str, str] = {
    TaskStatus.SUCCEEDED: "green", TaskStatus.FAILED: "bold red",
    TaskStatus.UNKNOWN: "bold red", TaskStatus.CANCELLED: "yellow",
    TaskStatus.PAUSED: "yellow", TaskStatus.WAITING_APPROVAL: "magenta",
    TaskStatus.WAITING_EXTERNAL: "magenta", TaskStatus.RUNNING: "cyan",
    TaskStatus.QUEUED: "blue",
}
#: Event types that end a task or need a person, by colour; others by their family.
_EVENT_STYLES: dict[str, str] = {
    EventType.TASK_SUCCEEDED: "bold green", EventType.TASK_FAILED: "bold red",
    EventType.TASK_CANCELLED: "bold yellow", EventType.TASK_UNKNOWN: "bold red",
    EventType.TASK_HANDOFF: "bold magenta", EventType.STEP_FAILED: "red",
    EventType.ACTION_FAILED: "red", EventType.ACTION_UNKNOWN: "red",
    EventType.STEP_COMPLETED: "cyan", EventType.TASK_PROGRESS: "dim",
}
#: Fields whose value is a status, coloured as one.
_STATUS_FIELDS = frozenset({"status"})
#: The fields that make a record an event.
_EVENT_FIELDS = frozenset({"event_id", "task_id", "sequence", "type", "payload"})
#: The fields that make a stored record an event (``admin history``'s ``events``).
_EVENT_RECORD_FIELDS = frozenset({"sequence", "type", "occurred_at", "payload"})
#: Columns never wrapped, beside ``*id`` (copied and pasted, or short).
_WHOLE_COLUMNS = frozenset({"name", "status", "type", "owner"})
#: Longest cell a table shows of a nested value before cutting it (the JSON has it whole).
_CELL_CHARS = 60


def relative_time(at: float, now: float) -> str:
    """``at`` (epoch seconds) as a person says it from ``now``: "just now", "3 s ago",
    "5 min ago", "2 h ago", "4 d ago", or "in 10 s" for a time still to come."""
    delta = now - at
    size = abs(delta)
    if size < 1:
        return "just now"
    for unit, seconds in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if size >= seconds:
            amount = f"{int(size // seconds)} {unit}"
            return f"{amount} ago" if delta > 0 else f"in {amount}"
    raise AssertionError("unreachable: size >= 1")


def status_style(status: str) -> str:
    """The colour of a task status ("" for one this table does not know)."""
    return _STATUS_STYLES.get(status, "")


def _is_time(key: str, value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0 \
        and (key == "at" or key.endswith("_at") or key == "last_heartbeat")


def _compact(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False, separators=(", ", ": "))


def cell(key: str, value: Any, now: float, *, width: int | None = _CELL_CHARS) -> Text:
    """One value as shown in a table: times relative, statuses coloured, nested values as
    compact JSON (cut at ``width`` characters, if given)."""
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return Text("yes" if value else "no", style="green" if value else "dim")
    if _is_time(key, value):
        return Text(relative_time(float(value), now))
    if isinstance(value, str):
        return Text(value, style=status_style(value) if key in _STATUS_FIELDS else "")
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        shown = ", ".join(str(v) for v in value)  # roles, partitions: a list to read, not JSON
    else:
        shown = _compact(value) if isinstance(value, dict | list) else str(value)
    if width is not None and len(shown) > width:
        shown = shown[: width - 1] + "…"
    return Text(shown)


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def records_table(title: str, rows: list[dict[str, Any]], now: float) -> Table:
    """Rows of records as a table, one column per field (in the order fields first
    appear)."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    table = Table(title=Text(title, style="bold"), title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False)
    for column in columns:
        # Ids and names whole on one line (other columns fold): they are copied and pasted.
        whole = column.endswith("id") or column in _WHOLE_COLUMNS
        table.add_column(column, overflow="fold", no_wrap=whole)
    for row in rows:
        table.add_row(*(cell(c, row.get(c), now) for c in columns))
    return table


def fields_table(record: Mapping[str, Any], now: float) -> Table:
    """One record's fields, one per row (nested values whole)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in record.items():
        table.add_row(key, cell(key, value, now, width=None))
    return table


def supervision_tree(node: Mapping[str, Any]) -> Tree:
    """The admin ``tree`` answer's nested ``{name, alive, restarts, restart, children}``."""
    tree = Tree(_tree_label(node))
    _grow(tree, node.get("children") or [])
    return tree


def _grow(tree: Tree, children: Iterable[Mapping[str, Any]]) -> None:
    for child in children:
        _grow(tree.add(_tree_label(child)), child.get("children") or [])


def _tree_label(node: Mapping[str, Any]) -> Text:
    label = Text(str(node.get("name", "?")).rsplit("/", 1)[-1],
                 style="" if node.get("alive", True) else "red")
    if node.get("restart"):
        label.append(f"  {node['restart']}", style="dim")
    if node.get("restarts"):
        label.append(f"  {node['restarts']} restarts", style="yellow")
    return label


def render_answer(answer: Any, now: float) -> RenderableType:
    """A command's answer as a person reads it (the JSON output prints ``answer`` as is).
    An event (``watch`` prints each as its ``model_dump()``) is one :func:`event_line`."""
    if isinstance(answer, dict) and _EVENT_FIELDS <= answer.keys():
        try:
            return event_line(Event.model_validate(answer))
        except ValidationError:
            pass  # shaped like an event, but not one: shown as any record
    if not isinstance(answer, dict):
        if _is_records(answer):
            return records_table("", answer, now)
        return Text(str(answer))
    parts: list[RenderableType] = []
    plain = {k: v for k, v in answer.items()
             if not _is_records(v) and not (k == "tree" and isinstance(v, dict))}
    if plain:
        parts.append(fields_table(plain, now))
    for key, value in answer.items():
        if key == "tree" and isinstance(value, dict):
            parts.append(supervision_tree(value))
        elif _is_records(value):
            parts.append(event_lines(key, value) if _is_event_records(value)
                         else records_table(key, value, now))
    return Group(*parts) if parts else Text("(empty)", style="dim")


def event_line(event: Event) -> Text:
    """One event as a line of ``watch``: sequence, time of day, type, payload fields."""
    return _event_line(event.sequence, event.occurred_at, event.type, event.payload)


def _event_line(sequence: Any, occurred_at: Any, type_: Any, payload: Any) -> Text:
    line = Text(f"{sequence!s:>4}  ", style="dim")
    if isinstance(occurred_at, int | float):
        line.append(_clock(occurred_at), style="dim")
    kind = str(type_)
    style = _EVENT_STYLES.get(kind) or ("magenta" if kind.startswith(_ACTION) else "")
    line.append(f"  {kind:<22}", style=style)
    for key, value in (payload.items() if isinstance(payload, dict) else []):
        line.append(f" {key}=", style="dim")
        line.append(cell(key, value, occurred_at if isinstance(occurred_at, float) else 0.0))
    return line


def _is_event_records(rows: list[dict[str, Any]]) -> bool:
    """Stored events (``admin history``): shown as ``watch`` shows them, a line each."""
    return all(_EVENT_RECORD_FIELDS <= row.keys() for row in rows)


def event_lines(title: str, rows: list[dict[str, Any]]) -> Group:
    """Stored events under a title, one :func:`event_line` each."""
    return Group(Text(title, style="bold"), *(
        _event_line(r["sequence"], r["occurred_at"], r["type"], r["payload"]) for r in rows))


#: The action family's prefix, from the catalogue (type names are never spelled here).
_ACTION = EventType.ACTION_STARTED.split(".", 1)[0] + "."


def _clock(at: float) -> str:
    """Local time of day of an epoch time, to the second."""
    return time.strftime("%H:%M:%S", time.localtime(at))
