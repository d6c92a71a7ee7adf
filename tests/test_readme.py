"""The README's commands, run as written.

- "Quickstart": ``make demo``, whose output and exit code the README describes. (Its
  ``make test`` is this suite; it is not run from inside itself.)
- "Your own workflows": its ``myflows.py`` saved in a fresh directory, ``ratchet serve`` on
  it, then each command of its sh block in order (``tsk_...`` replaced by the id the
  ``submit`` before it printed), each exiting 0 with what it says it prints; the report
  that waits for a review is cancelled and ends CANCELLED.

The commands' stdout is a pipe here, so they print JSON lines (docs/cli.md).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RATCHET_BIN, ROOT

README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(section: str, kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", section, re.S)


def _commands(section: str) -> list[list[str]]:
    """The first sh block's commands (comments dropped)."""
    lines = [line.split("  #", 1)[0].strip() for line in _blocks(section, "sh")[0].splitlines()]
    return [shlex.split(line) for line in lines if line]


@pytest.mark.slow
def test_the_quickstart_demo_runs_as_written_and_ends_with_one_claim(tmp_path: Path) -> None:
    commands = _commands(_section("Quickstart"))
    assert commands == [["make", "demo"], ["make", "test"]]
    if not (ROOT / ".venv" / "bin" / "ratchet").exists():
        pytest.skip("make demo runs the project's .venv, which this run has not installed")
    # -o: the venv counts as installed (the suite never reinstalls the environment it runs
    # in); the state goes to a fresh directory.
    done = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", *commands[0][1:]], cwd=ROOT,
                          env={**os.environ, "RATCHET_STATE_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "status: SUCCEEDED" in done.stdout
    assert re.search(r"claims the finance system holds for \S+: 1$", done.stdout.strip(), re.M)
    assert (tmp_path / "demo" / "ratchet.db").exists()


def _check(argv: list[str], printed: list[dict[str, Any]], cwd: Path) -> None:
    """What each command of "Your own workflows" says it prints."""
    last = printed[-1]
    if argv[1] == "submit":
        assert last["task_id"].startswith("tsk_")
    elif argv[1] == "watch":
        assert last["type"] == "task.succeeded" and last["payload"]["output"] == {"total": 12}
    elif argv[1] == "status":
        assert last["status"] == "SUCCEEDED" and last["output"] == {"total": 12}
    elif argv[1:3] == ["admin", "history"]:
        assert [e["sequence"] for e in last["events"]] == list(range(1, len(last["events"]) + 1))
        assert last["events"][-1]["type"] == "task.succeeded"
    elif argv[1:3] == ["admin", "cancel"]:
        assert last["status"] == "cancel requested"
        assert last["effect"].startswith("at once: a running step is interrupted")
    elif argv[1] == "creds":
        assert last["file"].endswith("ann.nk")
        assert (cwd / "ann.nk").stat().st_mode & 0o077 == 0
    else:
        raise AssertionError(f"a README command this test does not check: {argv}")


@pytest.mark.slow
def test_the_readme_workflow_and_commands_run_as_written(tmp_path: Path) -> None:
    section = _section("Your own workflows")
    (tmp_path / "myflows.py").write_text(_blocks(section, "python")[0])
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    serve_argv, *commands = _commands(section)
    assert serve_argv[:2] == [".venv/bin/ratchet", "serve"]
    serve = subprocess.Popen([str(RATCHET_BIN), *serve_argv[1:], "--log-level", "warning"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        assert "serving" in json.loads(serve.stdout.readline())
        task_id = ""  # the id the last submit printed
        ran = []
        for argv in commands:
            assert argv[0] == ".venv/bin/ratchet", argv
            assert task_id or "tsk_..." not in argv, "a task id before any submit"
            argv = [str(RATCHET_BIN), *[task_id if a == "tsk_..." else a for a in argv[1:]]]
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, (argv, done.stdout, done.stderr)
            printed = [json.loads(line) for line in done.stdout.splitlines() if line]
            _check(argv, printed, tmp_path)
            if argv[1] == "submit":
                task_id = printed[-1]["task_id"]
            ran.append(" ".join(argv[1:3]))
        assert ran.count("admin cancel") == 1 and ran.index("admin cancel") > 3
        # The cancelled report (the last one submitted) ends CANCELLED: watch stops there.
        ended = subprocess.run([str(RATCHET_BIN), "watch", task_id], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=60)
        assert json.loads(ended.stdout.splitlines()[-1])["type"] == "task.cancelled"
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
