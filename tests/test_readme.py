"""The README's "Your own workflows" section, run as written: its ``myflows.py`` saved in
a fresh directory, ``ratchet serve`` on it, then each of its commands in order (``tsk_...``
replaced by the submitted task's id), each exiting 0 with what it says it prints."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RATCHET_BIN, ROOT

README = (ROOT / "README.md").read_text()
SECTION = README.split("## Your own workflows", 1)[1].split("\n## ", 1)[0]


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", SECTION, re.S)


def _commands() -> list[list[str]]:
    """The sh block's commands after ``serve`` (comments dropped)."""
    lines = [line.split("  #", 1)[0].strip() for line in _blocks("sh")[0].splitlines()]
    return [shlex.split(line) for line in lines if line and " serve " not in line]


@pytest.mark.slow
def test_the_readme_workflow_and_commands_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "myflows.py").write_text(_blocks("python")[0])
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    serve = subprocess.Popen([str(RATCHET_BIN), "--log-level", "warning", "serve",
                              "--app", "myflows:app"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        assert "serving" in json.loads(serve.stdout.readline())
        task_id = None
        for argv in _commands():
            assert argv[0] == ".venv/bin/ratchet", argv
            argv = [str(RATCHET_BIN), *[task_id if a == "tsk_..." else a for a in argv[1:]]]
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=60)
            printed = [json.loads(line) for line in done.stdout.splitlines() if line]
            if argv[1:3] == ["admin", "cancel"]:  # the task finished already: refused
                assert done.returncode == 2, (done.stdout, done.stderr)
                assert printed[-1]["error"]["code"] == "ILLEGAL_TRANSITION"
                continue
            assert done.returncode == 0, (argv, done.stdout, done.stderr)
            if argv[1] == "submit":
                task_id = printed[-1]["task_id"]
            if argv[1] == "watch":
                assert printed[-1]["type"] == "task.succeeded"
                assert printed[-1]["payload"]["output"] == {"total": 12}
            if argv[1] == "creds":
                key = tmp_path / "ann.nk"
                assert printed[-1]["file"].endswith("ann.nk") and key.stat().st_mode & 0o077 == 0
        assert task_id is not None
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
