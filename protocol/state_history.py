"""Reading a task's past states: a structural diff of two states, and the small predicate
language of ``admin bisect`` (docs/admin.md, "Time travel").

A predicate is one or more clauses joined by ``and``; a clause is ``PATH OP VALUE`` or
``has PATH``. PATH is dotted (``claim.status``, ``items.0.amount``: a number indexes a
list); OP is one of ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``; VALUE is JSON (``"done"``,
``3``, ``true``, ``null``) or a bare word, read as a string. Nothing is evaluated as code:
a command is hostile until proven otherwise, and this is the whole language.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ratchet.protocol.errors import InvalidMessage

__all__ = ["Predicate", "parse_predicate", "structural_diff"]

_MISSING = object()
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge}
_CLAUSE = re.compile(r"^\s*(?:(has)\s+(\S+)|(\S+?)\s*(==|!=|<=|>=|<|>)\s*(.+?))\s*$")
MAX_PREDICATE = 1000  # characters
MAX_DIFF = 500  # entries: a diff past it says how many more


def structural_diff(old: Any, new: Any, path: str = "", out: dict[str, list[Any]] | None = None
                    ) -> dict[str, list[Any]]:
    """``{added: [[path, value]], removed: [[path, value]], changed: [[path, before, after]]}``
    from ``old`` to ``new``, into maps and lists (a list that changed length compares by
    index)."""
    out = out if out is not None else {"added": [], "removed": [], "changed": []}
    if sum(len(v) for v in out.values()) >= MAX_DIFF:
        return out
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new), key=str):
            here = f"{path}.{key}" if path else str(key)
            if key not in old:
                out["added"].append([here, new[key]])
            elif key not in new:
                out["removed"].append([here, old[key]])
            else:
                structural_diff(old[key], new[key], here, out)
    elif isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            here = f"{path}.{i}" if path else str(i)
            if i >= len(old):
                out["added"].append([here, new[i]])
            elif i >= len(new):
                out["removed"].append([here, old[i]])
            else:
                structural_diff(old[i], new[i], here, out)
    elif old != new or type(old) is not type(new):
        out["changed"].append([path, old, new])
    return out


@dataclass(frozen=True)
class _Clause:
    path: tuple[str, ...]
    op: str  # "has" or a comparison
    value: Any = None

    def holds(self, state: Mapping[str, Any]) -> bool:
        found = _lookup(state, self.path)
        if self.op == "has":
            return found is not _MISSING
        if found is _MISSING:
            return False
        try:
            return bool(_OPS[self.op](found, self.value))
        except TypeError:  # "3" < 4: not comparable, so not true
            return False


@dataclass(frozen=True)
class Predicate:
    text: str
    clauses: tuple[_Clause, ...]

    def holds(self, state: Mapping[str, Any]) -> bool:
        return all(c.holds(state) for c in self.clauses)


def parse_predicate(text: Any) -> Predicate:
    """The predicate ``text`` says. Raises InvalidMessage (field ``predicate``)."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_PREDICATE:
        raise InvalidMessage(f"args.predicate must be text of 1..{MAX_PREDICATE} characters",
                             field="predicate")
    clauses = []
    for part in re.split(r"\s+and\s+", text.strip()):
        m = _CLAUSE.match(part)
        if m is None:
            raise InvalidMessage(f"cannot read the clause {part[:100]!r}: PATH OP VALUE or"
                                 " has PATH", field="predicate")
        if m.group(1):
            clauses.append(_Clause(tuple(m.group(2).split(".")), "has"))
        else:
            clauses.append(_Clause(tuple(m.group(3).split(".")), m.group(4),
                                   _value(m.group(5))))
    return Predicate(text, tuple(clauses))


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # a bare word: a string


def _lookup(state: Any, path: tuple[str, ...]) -> Any:
    here = state
    for part in path:
        if isinstance(here, Mapping) and part in here:
            here = here[part]
        elif isinstance(here, list) and part.isdigit() and int(part) < len(here):
            here = here[int(part)]
        else:
            return _MISSING
    return here
