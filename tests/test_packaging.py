"""One import namespace, and the layer rule, checked on the source.

Layers, lowest first: protocol ← persistence ← actors ← supervisors. A module imports only
from its own layer or the ones below it; nothing in the package imports the layers by
their old top-level names; ``ratchet.testing`` (test components) is imported by no layer,
except by the command line for ``ratchet demo``.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

LAYERS = ["protocol", "persistence", "actors", "supervisors"]
EXCEPTIONS = {("supervisors/cli/__init__.py", "ratchet.testing.demo")}  # `ratchet demo`
OLD_NAMES = {*LAYERS, "simulators", "examples"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute module name ``path`` imports (both ``import x`` and ``from x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def _layer_files() -> list[tuple[str, Path]]:
    return [(layer, p) for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))]


def test_each_layer_imports_only_its_own_layer_and_those_below() -> None:
    broken = []
    for layer, path in _layer_files():
        allowed = {f"ratchet.{name}" for name in LAYERS[: LAYERS.index(layer) + 1]}
        for line, module in _imports(path):
            if not module.startswith("ratchet"):
                continue
            top = ".".join(module.split(".")[:2])
            if top not in allowed and (str(path.relative_to(ROOT)), module) not in EXCEPTIONS:
                broken.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert broken == []


def test_nothing_imports_the_old_top_level_names() -> None:
    sources = [p for _, p in _layer_files()]
    for folder in ("ratchet/testing", "tests", "bench", "examples"):
        sources += sorted((ROOT / folder).rglob("*.py"))
    sources.append(ROOT / "ratchet" / "__init__.py")
    old = [f"{p.relative_to(ROOT)}:{line} imports {module}" for p in sources
           for line, module in _imports(p) if module.split(".")[0] in OLD_NAMES]
    assert old == []


def test_every_layer_is_reachable_through_the_one_namespace() -> None:
    for layer in LAYERS:
        link = ROOT / "ratchet" / layer
        assert link.is_symlink() and link.resolve() == (ROOT / layer).resolve()


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_name_that_a_users_own_modules_cannot_shadow(
    tmp_path: Path,
) -> None:
    # Built from a copy: pip builds in the source tree, and its build/ must not be ours.
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".*_cache", ".ratchet"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(tmp_path / "dist"), str(source)], check=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("ratchet_runtime-*.whl")
    names = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {n for n in names if not n.endswith(".dist-info")} == {"ratchet"}
    members = zipfile.ZipFile(wheel).namelist()
    assert "ratchet/py.typed" in members
    assert "ratchet/protocol/codec.py" in members and "ratchet/testing/finance.py" in members
    assert not any(m.startswith(("ratchet/tests/", "ratchet/bench/")) for m in members)
    # A user's own protocol.py and persistence/ beside their app do not break the import.
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "protocol.py").write_text("raise ImportError('the user protocol')\n")
    (tmp_path / "app" / "persistence").mkdir()
    (tmp_path / "app" / "persistence" / "__init__.py").write_text("X = 1\n")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True, timeout=300)
    out = subprocess.run(
        [sys.executable, "-c", "import ratchet, ratchet.testing; print(ratchet.__version__)"],
        cwd=tmp_path / "app", env={"PYTHONPATH": f"{tmp_path / 'app'}:{site}"},
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == __import__("ratchet").__version__


PUBLIC = {
    "ratchet.protocol": [
        "Clock", "FakeClock", "SystemClock", "canonical", "decode_envelope", "decode_map",
        "encode", "parse_body", "ErrorCode", "IllegalTransition", "InvalidMessage", "NotFound",
        "RatchetError", "RequestConflict", "Unavailable", "UnknownWorkflow", "VersionConflict",
        "ActorCrashed", "ActorStopped", "AskTimeout", "DuplicateMessage", "Escalation",
        "RemoteError", "WorkflowDefinitionError",
        "new_id", "request_hash", "task_id_for", "SCHEMA_VERSION", "Envelope", "ErrorBody",
        "Event", "GetTask", "Reply", "StartTask", "SubmitTask", "TaskAccepted", "TaskSnapshot",
        "TERMINAL", "TRANSITIONS", "TaskEvent", "TaskStatus", "is_terminal", "transition",
    ],
    "ratchet.persistence": [
        "AdminStore", "KeyringStore", "LeaseStore", "OutboxStore", "StorePort", "TaskStore",
        "BLOB_THRESHOLD",
        "StateDelta", "StateTracker", "LoadedState", "Store", "TaskRecord", "AcceptResult",
        "ChangeResult", "CheckpointWrite", "NewTask", "OutboxRow",
        "TaskChange",
    ],
    "ratchet.actors": [
        "Client", "Actor", "ActorRef", "ActorSystem", "Registry", "StepContext", "Workflow",
    ],
    "ratchet.supervisors": [
        "Node", "NodeConfig", "Restart", "Strategy", "backoff_delay", "intensity_exceeded",
        "ChildSpec", "Supervisor",
    ],
    "ratchet.testing": [
        "FakeClock", "FinanceClient", "FinanceSimulatorProcess", "SimulatorStartError",
        "replay", "replay_corpus",
    ],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_each_sub_package_exports_exactly_its_public_names(package: str) -> None:
    module = __import__(package, fromlist=["__all__"])
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    for name in module.__all__:
        assert getattr(module, name) is not None
