"""A workflow definition's hash: what a task started on, so that changed code under the same
version number is noticed instead of run silently (docs/workflows.md, "Versions").

The hash covers the graph (its nodes, their kinds and where each can go), the tools its
nodes declare (an agent's: names, kinds and argument/result schemas; a tool a step calls
through ``ctx.call`` is not known before it is called) and the code of every step node's
function, read as the syntax tree of its source: a comment, blank lines or
formatting do not change it, and neither does another Python version's bytecode; any
change of what the code does does. A function whose source cannot be read (made by
``exec``, say) contributes its bytecode instead.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import textwrap
from typing import Any

__all__ = ["Definition", "definition_hash"]


class Definition:
    """A workflow's definition, read when it is registered, hashed when first asked.

    The steps' code is read at once (:func:`_code_of`): the hash must be of the code that
    runs, and a source file replaced later (a deploy beside a running node) must not stand
    for it. The tools' argument and result schemas come from their models, which do not
    change: they are built at the first :meth:`hash` — a node that resumes a task of one
    workflow builds no other workflow's tool models first (pydantic's schema machinery and
    its plugin scan, ~10 ms of the bench app's start; docs/operations.md, "Restart (W4)").
    """

    def __init__(self, workflow: Any) -> None:
        self._tools = {t.name: t for node in workflow.nodes.values()
                       for t in getattr(node, "tools", ())}
        nodes = {}
        for name, node in sorted(workflow.nodes.items()):
            fn = getattr(node, "fn", None)
            nodes[name] = {"kind": node.kind, "code": _code_of(fn) if callable(fn) else None}
        self._shape: dict[str, Any] = {"start": workflow.start, "nodes": nodes,
                                       "edges": sorted(map(list, workflow.transition_table()))}
        self._hash: str | None = None

    def hash(self) -> str:
        """``sha256:`` of the graph, its declared tools and its steps' code."""
        if self._hash is None:
            shape = {**self._shape, "tools": {name: _tool_of(tool)
                                              for name, tool in sorted(self._tools.items())}}
            data = json.dumps(shape, sort_keys=True, default=str).encode()
            self._hash = "sha256:" + hashlib.sha256(data).hexdigest()
        return self._hash


def definition_hash(workflow: Any) -> str:
    """``sha256:`` of the workflow's graph, its declared tools and its steps' code."""
    return Definition(workflow).hash()


#: Step functions' hashes by code object: a graph built in a loop (a thousand steps of one
#: function) reads and parses its source once, not a thousand times.
_BY_CODE: dict[Any, str] = {}


def _code_of(fn: Any) -> str:
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is not None and code in _BY_CODE:
        return _BY_CODE[code]
    digest = _read_code(fn)
    if code is not None and len(_BY_CODE) < 100_000:
        _BY_CODE[code] = digest
    return digest


def _read_code(fn: Any) -> str:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        code = getattr(fn, "__code__", None)
        return code.co_code.hex() if code is not None else type(fn).__name__
    node = tree.body[0] if tree.body else tree
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.decorator_list = []  # how it was registered is not what it does
    return hashlib.sha256(ast.dump(node, annotate_fields=False).encode()).hexdigest()


def _tool_of(tool: Any) -> dict[str, Any]:
    schemas = {}
    for part in ("args", "result"):
        model = getattr(tool, part, None)
        try:
            schemas[part] = model.model_json_schema() if model is not None else None
        except Exception:  # a model without a JSON schema: its name stands for it
            schemas[part] = getattr(model, "__name__", str(model))
    return {"kind": getattr(tool, "kind", None), **schemas}
