"""Size limits of the package's source, checked on the source: no module over 400 lines and
no function (or method) over 80 lines, so that each module holds one concept and each
function fits on a screen.

A module's lines are its newline count; a function's are ``end_lineno - lineno + 1`` of its
AST node (decorators not counted, nested functions counted within their parent too).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

FOLDERS = ["protocol", "persistence", "actors", "supervisors", "ratchet/testing"]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


def test_the_limits_cover_every_package_folder() -> None:
    assert all((ROOT / folder).is_dir() for folder in FOLDERS)
    assert len(_sources()) > len(FOLDERS)


def test_no_module_is_over_the_line_limit() -> None:
    offenders = []
    for path in _sources():
        lines = path.read_text().count("\n")
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert offenders == [], f"modules over {MAX_MODULE_LINES} lines: {offenders}"


def test_no_function_is_over_the_line_limit() -> None:
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    offenders.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert offenders == [], f"functions over {MAX_FUNCTION_LINES} lines: {offenders}"
