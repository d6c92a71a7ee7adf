"""The ``ratchet`` command's kept compiled code (ratchet/code_cache.py): a second start runs
the code objects the first compiled, classes behave as without it, and nothing of it
outlives the start. Each case runs in a process of its own: the cache patches modules of
the standard library, which this test process must keep as they are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: Defines what the three patched modules compile, then reports on it as one JSON line.
START = """
import json, sys
sys.dont_write_bytecode = False
from pathlib import Path
from ratchet import code_cache
code_cache.MAX_KEPT = int(sys.argv[2])
code_cache.install(Path(sys.argv[1]))
import collections, dataclasses, typing

@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int = 2

Pair = collections.namedtuple("Pair", "left right")
ref = typing.ForwardRef("dict[str, list[int]]")
try:
    typing.ForwardRef("not an expression (")
    bad = None
except SyntaxError as exc:
    bad = str(exc)
try:
    Point(1).x = 3
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
report = {"kept": len(code_cache._kept), "compiled": len(code_cache._new),
          "point": repr(Point(1)), "equal": Point(1) == Point(1, 2), "frozen": frozen,
          "pair": repr(Pair(1, 2)), "ref": ref.__forward_code__.co_names, "bad": bad}
code_cache.release()
report["given_back"] = [name in vars(module) for module, name in
                        ((dataclasses, "exec"), (typing, "compile"), (collections, "eval"))]
print(json.dumps(report))
"""


def _start(cache: Path, max_kept: int = 20_000) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", START, str(cache), str(max_kept)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


pytestmark = pytest.mark.skipif(sys.version_info >= (3, 13),
                                reason="Python 3.13 compiles a dataclass in one text: no cache")


def test_a_second_start_runs_the_code_the_first_compiled_and_compiles_none(
        tmp_path: Path) -> None:
    cache = tmp_path / "code.bin"
    first = _start(cache)
    second = _start(cache)
    assert first["kept"] == 0 and first["compiled"] > 0
    assert second["kept"] >= first["compiled"] and second["compiled"] == 0
    for report in (first, second):
        assert report["point"] == "Point(x=1, y=2)" and report["equal"] and report["frozen"]
        assert report["pair"] == "Pair(left=1, right=2)"
        assert report["ref"] == ["dict", "str", "list", "int"]
        assert "Forward reference must be an expression" in str(report["bad"])


def test_a_file_at_its_bound_takes_no_more_texts(tmp_path: Path) -> None:
    cache = tmp_path / "code.bin"
    first = _start(cache, max_kept=1)  # more than one text compiled: nothing written
    assert first["compiled"] > 1 and not cache.exists()
    assert _start(cache)["kept"] == 0


def test_the_end_of_the_start_gives_the_standard_library_its_builtins_back(
        tmp_path: Path) -> None:
    assert _start(tmp_path / "code.bin")["given_back"] == [False, False, False]


def test_a_file_of_another_python_or_unreadable_is_no_file(tmp_path: Path) -> None:
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x00\x00\r\n" + b"anything")  # another magic number
    torn = tmp_path / "torn.bin"
    first = _start(tmp_path / "good.bin")
    torn.write_bytes((tmp_path / "good.bin").read_bytes()[:100])  # cut short
    for cache in (other, torn, tmp_path / "missing" / "code.bin"):
        report = _start(cache)
        assert report["kept"] == 0 and report["compiled"] == first["compiled"]


def test_make_install_writes_the_texts_of_what_a_serving_node_imports(tmp_path: Path) -> None:
    cache = tmp_path / "serve.bin"
    out = subprocess.run([sys.executable, "-m", "ratchet.code_cache", str(cache)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    code = ("import sys, ratchet.code_cache as c; from pathlib import Path;"
            " c.install(Path(sys.argv[1])); import ratchet.supervisors.cli.serve;"
            " print(len(c._kept), len(c._new))")
    run = subprocess.run([sys.executable, "-c", code, str(cache)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    kept, compiled = map(int, run.stdout.split())
    assert kept > 500 and compiled == 0, run.stderr
