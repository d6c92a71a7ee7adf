"""The command line as a user runs it: serve (embedded default), submit, watch, status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from ratchet.protocol.auth import new_seed, write_key_file
from tests.conftest import RATCHET_BIN, ROOT


def _ratchet(state: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_submit_watch_status_and_a_clean_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "state"
    serve = subprocess.Popen(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level",
         "warning", "serve", "--app", "examples.report:app"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert serve.stdout is not None
        banner = json.loads(serve.stdout.readline())
        assert banner["workflows"] == ["expense.report"]
        nats_pid = int((state / "nats" / "nats-server.pid").read_text())

        submitted = _ratchet(state, "submit", "expense.report", "--key", "r-1", "--input",
                             json.dumps({"items": [{"what": "taxi", "amount": 30}]}))
        assert submitted.returncode == 0, submitted.stderr
        task_id = json.loads(submitted.stdout)["task_id"]

        watched = _ratchet(state, "watch", task_id)
        assert watched.returncode == 0, watched.stderr
        events = [json.loads(line) for line in watched.stdout.splitlines()]
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        assert events[-1]["type"] == "task.succeeded"

        later = _ratchet(state, "watch", task_id, "--after", "5")
        assert [json.loads(x)["sequence"] for x in later.stdout.splitlines()] == list(
            range(6, len(events) + 1))

        status = _ratchet(state, "status", task_id)
        snapshot = json.loads(status.stdout)
        assert snapshot["status"] == "SUCCEEDED" and snapshot["output"]["total"] == 30

        missing = _ratchet(state, "status", "tsk_nope")
        assert missing.returncode == 2 and json.loads(missing.stdout)["error"]["code"] == "NOT_FOUND"

        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 0
        assert not _alive(nats_pid), "the embedded nats-server outlived its node"
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_graph_prints_the_transition_table_and_a_mermaid_diagram(tmp_path: Path) -> None:
    out = _ratchet(tmp_path, "graph", "approve", "--app", "tests.graph_apps:app")
    assert out.returncode == 0, out.stderr
    assert "manager   approval  no decision in 3600s  director" in out.stdout
    assert "flowchart TD" in out.stdout


def test_admin_verbs_are_wrapped_by_the_cli(tmp_path: Path) -> None:
    state = tmp_path / "state"
    serve = subprocess.Popen(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level",
         "warning", "serve", "--app", "examples.report:app"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert serve.stdout is not None
        json.loads(serve.stdout.readline())
        # Signed with the state dir's local admin key, no flags needed.
        listed = _ratchet(state, "admin", "list")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == {"tasks": [], "next_cursor": None}
        stranger = tmp_path / "stranger.nk"
        write_key_file(stranger, new_seed())  # a key the node never granted
        denied = _ratchet(state, "admin", "tree", "--creds", str(stranger))
        assert denied.returncode == 2
        assert json.loads(denied.stdout)["error"]["code"] == "UNAUTHENTICATED"
        letters = _ratchet(state, "admin", "dlq", "list")  # the dlq-list verb
        assert json.loads(letters.stdout) == {"subjects": [], "letters": [], "next_after": None}
        missing = _ratchet(state, "admin", "dlq", "show", "7")
        assert json.loads(missing.stdout)["error"]["details"] == {"id": 7}
        wrong = _ratchet(state, "admin", "dlq", "frob")
        assert wrong.returncode != 0 and "ratchet admin dlq {list|show|replay|purge}" in (
            wrong.stdout + wrong.stderr)
        unknown = _ratchet(state, "diagnose", "tsk_nothere")
        assert unknown.returncode == 2
        assert json.loads(unknown.stdout)["error"]["code"] == "NOT_FOUND"
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
