"""``ratchet submit`` and ``ratchet watch`` as a user runs them (the installed entry point,
one ``ratchet serve`` for the module): validated by the node unless ``--async``, a refusal
is one line and a non-zero exit, ``--wait`` prints the outcome, ``watch`` ends by itself
and knows a task that does not exist, and a missing NATS is said in one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratchet.protocol.ids import task_id_for
from tests.conftest import RATCHET_BIN, ROOT


def _ratchet(state: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the command; one still running after ``timeout`` fails the test with the stacks
    of its threads (faulthandler, on SIGABRT)."""
    argv = [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", *args]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate()
        pytest.fail(f"{args} still running after {timeout} s; stacks:\n{err[-4000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in done.stdout.splitlines() if line]


def _one_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one line a refused command prints, as JSON, and nothing of a traceback."""
    [line] = _lines(done)
    assert "Traceback" not in done.stderr, done.stderr
    return dict(line["error"])


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state dir with ``ratchet serve --app tests.apps:app`` running on it."""
    state = tmp_path_factory.mktemp("cli-submit") / "state"
    serve = subprocess.Popen(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", "serve",
         "--app", "tests.apps:app"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        assert "serving" in json.loads(serve.stdout.readline())
        yield state
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


@pytest.mark.slow
def test_an_unknown_workflow_is_refused_in_one_line_with_a_non_zero_exit(state: Path) -> None:
    done = _ratchet(state, "submit", "no.such.flow", "--key", "x-1")
    assert done.returncode == 2
    error = _one_error(done)
    assert error["code"] == "INVALID_ARGUMENT" and "no.such.flow" in error["message"]


@pytest.mark.slow
def test_the_same_key_with_another_input_is_a_conflict(state: Path) -> None:
    first = _ratchet(state, "submit", "three", "--key", "k-1", "--input", '{"a": 1}')
    assert first.returncode == 0, first.stderr
    assert _lines(first) == [{"task_id": task_id_for("default", "k-1"), "status": "QUEUED",
                              "created": True, "tenant": "default"}]
    again = _ratchet(state, "submit", "three", "--key", "k-1", "--input", '{"a": 1}')
    assert again.returncode == 0 and _lines(again)[0]["created"] is False
    other = _ratchet(state, "submit", "three", "--key", "k-1", "--input", '{"a": 2}')
    assert other.returncode == 2
    error = _one_error(other)
    assert error["code"] == "CONFLICT"
    assert error["details"]["task_id"] == task_id_for("default", "k-1")


@pytest.mark.slow
def test_wait_prints_the_output_or_exits_3_with_the_failure(state: Path) -> None:
    done = _ratchet(state, "submit", "three", "--key", "w-1", "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    assert _lines(done) == [{"task_id": task_id_for("default", "w-1"), "tenant": "default",
                             "status": "SUCCEEDED", "output": {"count": 3}}]
    failed = _ratchet(state, "submit", "three", "--key", "w-2", "--input",
                      '{"always_fail_at": 1}', "--wait", "--timeout", "60")
    assert failed.returncode == 3
    error = _one_error(failed)
    assert error["code"] == "TASK_FAILED"
    assert error["details"]["reason"] == "step s1 failed 3 times"


@pytest.mark.slow
def test_wait_exits_6_on_its_timeout_and_4_once_the_task_is_cancelled(state: Path) -> None:
    slow = ["submit", "ten", "--key", "c-1", "--input", '{"sleep": 30}']
    timed_out = _ratchet(state, *slow, "--wait", "--timeout", "1")
    assert timed_out.returncode == 6
    assert _one_error(timed_out)["code"] == "TIMEOUT"
    waiting = subprocess.Popen(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", *slow,
         "--wait", "--timeout", "60"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        cancel = _ratchet(state, "admin", "cancel", task_id_for("default", "c-1"))
        assert cancel.returncode == 0, cancel.stdout
        assert waiting.wait(timeout=60) == 4
        assert waiting.stdout is not None
        assert json.loads(waiting.stdout.read())["error"]["code"] == "TASK_CANCELLED"
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()


@pytest.mark.slow
def test_async_publishes_on_jetstream_and_watch_ends_at_the_terminal_event(
        state: Path) -> None:
    done = _ratchet(state, "submit", "three", "--key", "a-1", "--async")
    assert done.returncode == 0, done.stderr
    assert _lines(done) == [{"task_id": task_id_for("default", "a-1"), "tenant": "default"}]
    watched = _ratchet(state, "watch", task_id_for("default", "a-1"), timeout=30)
    assert watched.returncode == 0, watched.stderr
    assert _lines(watched)[-1]["type"] == "task.succeeded"
    failing = _ratchet(state, "submit", "three", "--key", "a-2", "--async", "--input",
                       '{"always_fail_at": 0}')
    assert failing.returncode == 0
    watched = _ratchet(state, "watch", task_id_for("default", "a-2"), timeout=60)
    assert watched.returncode == 3 and _lines(watched)[-1]["type"] == "task.failed"


@pytest.mark.slow
def test_watch_of_a_task_that_does_not_exist_says_so_and_exits(state: Path) -> None:
    done = _ratchet(state, "watch", task_id_for("default", "never-submitted"), timeout=30)
    assert done.returncode == 2
    assert _one_error(done)["code"] == "NOT_FOUND"


def test_invalid_json_input_is_one_line_on_stderr_and_exit_2(tmp_path: Path) -> None:
    done = _ratchet(tmp_path, "submit", "three", "--key", "j-1", "--input", "{amount: 1}")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--input is not valid JSON" in done.stderr


def test_an_unreachable_nats_is_one_line_within_seconds(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"nats://ann:s3cret@127.0.0.1:{port}"
    began = time.monotonic()
    done = _ratchet(tmp_path, "submit", "three", "--key", "u-1", "--nats-url", url,
                    timeout=30)
    assert time.monotonic() - began < 15
    assert done.returncode == 2
    error = _one_error(done)
    assert error["message"] == f"cannot reach NATS at nats://ann:***@127.0.0.1:{port}"
    assert "s3cret" not in done.stdout + done.stderr
