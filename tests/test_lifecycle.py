"""`ratchet serve` starting and stopping as a terminal or a process manager sees it: the
installed entry point in a subprocess; exit codes, and exit times within a bound.

Every refused start exits within 5 s with its own status and one line saying why; SIGINT
and SIGTERM stop the node and its embedded nats-server whatever stdout is; an unreachable
NATS ends the start after ``--nats-connect-timeout``; the embedded server's port is kept
per state dir (docs/operations.md, "Starting and stopping").
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import ratchet
from ratchet.persistence.store import Store
from ratchet.supervisors.node import embedded_nats
from ratchet.supervisors.node.embedded_nats import EmbeddedNats, free_port
from tests.conftest import RATCHET_BIN, ROOT, NodeFactory

#: What a refused start may take, start to exit (the issue's bound).
REFUSED_WITHIN = 5.0

#: `ratchet serve`'s exit statuses (supervisors/cli/serve.py, docs/operations.md).
EXIT_NODE_ID_IN_USE, EXIT_PARTITIONS, EXIT_READ_ONLY, EXIT_NATS_UNREACHABLE, EXIT_PORT_TAKEN = (
    10, 11, 12, 13, 14)


def _serve_args(state: Path, *flags: str, app: str = "tests.apps:app",
                level: str = "warning") -> list[str]:
    return [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", level, "serve",
            "--app", app, *flags]


def _serve(state: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(_serve_args(state, *flags), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _banner(proc: subprocess.Popen[str]) -> dict[str, object]:
    """The "serving" line (the node is up)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert '"serving"' in line, (line, proc.stderr.read() if proc.poll() is not None
                                 and proc.stderr else "")
    return dict(json.loads(line))


def _refused(state: Path, *flags: str) -> tuple[int, str, float]:
    """Run a start that must be refused: its exit status, its stderr, its duration."""
    started = time.monotonic()
    done = subprocess.run(_serve_args(state, *flags), cwd=ROOT, capture_output=True,
                          text=True, timeout=REFUSED_WITHIN + 25)
    return done.returncode, done.stderr, time.monotonic() - started


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _until(condition: Callable[[], bool], bound: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound} s: {what}")
        time.sleep(0.02)


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGINT, bound: float = 30) -> int:
    proc.send_signal(sig)
    return proc.wait(timeout=bound)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _one_line(stderr: str, code: str) -> str:
    """The refusal's line: the last one on stderr, naming its code."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and code in lines[-1], stderr
    return lines[-1]


@pytest.mark.slow
def test_serve_started_twice_on_one_state_dir_is_refused_within_5_s_and_the_first_serves_on(
        tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    state = tmp_path / "state"
    first = _serve(state)
    procs.append(first)
    _banner(first)
    nats_pid = int((state / "nats" / "nats-server.pid").read_text())

    status, stderr, took = _refused(state)

    assert status == EXIT_NODE_ID_IN_USE and took < REFUSED_WITHIN, (status, took, stderr)
    assert "in use by live process" in _one_line(stderr, "NODE_ID_IN_USE")
    assert first.poll() is None and _alive(nats_pid), "the refused start hurt the first node"
    assert _stop(first) == 0
    assert not _alive(nats_pid)


def test_a_partition_count_mismatch_is_refused_within_5_s(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _make_store(state, partitions=16)

    status, stderr, took = _refused(state, "--partitions", "8")

    assert status == EXIT_PARTITIONS and took < REFUSED_WITHIN, (status, took, stderr)
    assert "the store has 16 partitions" in _one_line(stderr, "PARTITION_COUNT_MISMATCH")
    assert not (state / "nats" / "nats-server.pid").exists(), "refused, yet a server started"


def test_a_read_only_database_is_refused_within_5_s(tmp_path: Path) -> None:
    state = tmp_path / "state"
    db = _make_store(state, partitions=16)
    with _read_only(db):
        status, stderr, took = _refused(state)

    assert status == EXIT_READ_ONLY and took < REFUSED_WITHIN, (status, took, stderr)
    assert str(db) in _one_line(stderr, "STORE_READ_ONLY")


def test_an_unreachable_nats_url_ends_the_start_after_the_connect_timeout(
        tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nobody listens there

    status, stderr, took = _refused(tmp_path / "state", "--nats-url", url,
                                    "--nats-connect-timeout", "1")

    assert status == EXIT_NATS_UNREACHABLE and took < 1 + REFUSED_WITHIN, (status, took, stderr)
    assert f"cannot reach NATS at {url}" in _one_line(stderr, "NATS_UNREACHABLE")


def test_sigterm_stops_serve_while_it_is_still_trying_to_reach_nats(
        tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    proc = _serve(tmp_path / "state", "--nats-url", url, "--nats-connect-timeout", "600")
    procs.append(proc)
    assert proc.stderr is not None
    for line in proc.stderr:  # each failed attempt is logged: it is trying now
        if "nats error" in line:
            break
    started = time.monotonic()
    assert _stop(proc, signal.SIGTERM, bound=REFUSED_WITHIN) == 0
    assert time.monotonic() - started < REFUSED_WITHIN
    assert proc.stdout is not None and '"while": "starting"' in proc.stdout.read()


@pytest.mark.slow
def test_sigint_to_the_process_group_of_serve_piped_to_tee_stops_the_node_and_its_server(
        tmp_path: Path) -> None:
    """`ratchet serve ... 2>&1 | tee log` and Ctrl-C: the terminal sends SIGINT to the
    whole pipeline; tee dies first, the node's stdout is then a broken pipe."""
    state, log, status = tmp_path / "state", tmp_path / "serve.log", tmp_path / "status"
    command = " ".join(_serve_args(state))
    shell = subprocess.Popen(["bash", "-c", f"{{ {command}; echo $? > {status}; }} 2>&1"
                                            f" | tee {log} > /dev/null"],
                             cwd=ROOT, start_new_session=True)
    try:
        _until(lambda: log.exists() and '"serving"' in log.read_text(), 60, "the node to serve")
        banner = json.loads(next(x for x in log.read_text().splitlines() if '"serving"' in x))
        node_pid = int(banner["pid"])
        nats_pid = int((state / "nats" / "nats-server.pid").read_text())

        os.killpg(shell.pid, signal.SIGINT)

        _until(lambda: status.exists() and status.read_text().strip() != "", 40,
               "the node to exit")
        assert status.read_text().strip() == "0"
        assert not _alive(node_pid)
        assert not _alive(nats_pid), "the embedded nats-server outlived its node"
        assert not (state / "nats" / "nats.url").exists(), "a stale URL file was left"
        shell.wait(timeout=10)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()


def _running(pid: int) -> bool:
    """Alive, and not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_node_killed_with_sigkill_takes_its_embedded_nats_server_with_it(
        tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    state = tmp_path / "state"
    proc = _serve(state)
    procs.append(proc)
    _banner(proc)
    nats_pid = int((state / "nats" / "nats-server.pid").read_text())
    assert _running(nats_pid)
    proc.kill()
    proc.wait()
    _until(lambda: not _running(nats_pid), 10, "the embedded nats-server to follow its node")


async def test_a_setpriv_too_old_to_bind_the_server_leaves_it_to_the_fork_hook(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """util-linux before 2.33 has a setpriv without ``--pdeathsig``: it says so and exits;
    the server is started again bound by the hook, and setpriv is not tried again."""
    old = tmp_path / "setpriv"
    old.write_text("#!/bin/sh\necho \"setpriv: unrecognized option '--pdeathsig'\" >&2\n"
                   "exit 1\n")
    old.chmod(0o755)
    monkeypatch.setattr(embedded_nats, "_setpriv", str(old))
    server = EmbeddedNats(tmp_path / "nats")
    try:
        url = await server.start(timeout=20)
        assert url.startswith("nats://127.0.0.1:") and embedded_nats._setpriv is None
        assert _running(int(server.pid_file.read_text()))
    finally:
        await server.stop()


@pytest.mark.slow
def test_the_embedded_nats_port_is_kept_across_restarts_and_overridden_by_nats_port(
        tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    state = tmp_path / "state"
    url_file, port_file = state / "nats" / "nats.url", state / "nats" / "nats.port"

    def run(*flags: str) -> str:
        proc = _serve(state, *flags)
        procs.append(proc)
        url = str(_banner(proc)["nats_url"])
        assert url_file.read_text().strip() == url
        assert _stop(proc) == 0
        return url

    first = run()
    assert run() == first, "a restart moved the server to another port"
    asked = free_port()
    assert run("--nats-port", str(asked)) == f"nats://127.0.0.1:{asked}"
    assert run() == f"nats://127.0.0.1:{asked}", "the port asked for was not kept"
    assert port_file.read_text().strip() == str(asked)

    with socket.socket() as squatter:  # another process takes the kept port
        squatter.bind(("127.0.0.1", asked))
        squatter.listen()
        moved = run()
        assert moved != f"nats://127.0.0.1:{asked}"
        assert port_file.read_text().strip() == moved.rsplit(":", 1)[1]
        status, stderr, took = _refused(state, "--nats-port", str(asked))
        assert status == EXIT_PORT_TAKEN and took < REFUSED_WITHIN, (status, stderr)
        assert f"port {asked}" in _one_line(stderr, "NATS_PORT_TAKEN")


@pytest.mark.slow
def test_a_second_sigint_cuts_the_drain_of_a_step_that_never_returns(
        tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    state, mark = tmp_path / "state", tmp_path / "in-the-step"
    proc = subprocess.Popen(
        _serve_args(state, "--drain-timeout", "120", app="tests.lifecycle_apps:app",
                    level="info"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RATCHET_TEST_HANG_MARK": str(mark), "PYTHONFAULTHANDLER": "1"})
    procs.append(proc)
    _banner(proc)
    submitted = subprocess.run(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", "submit",
         "hangs", "--key", "h-1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    _until(mark.exists, 30, "the step to start")

    proc.send_signal(signal.SIGINT)  # drains: would wait the whole 120 s for the step
    assert proc.stderr is not None
    for line in proc.stderr:  # two signals sent at once may arrive as one
        if "node stopping" in line:
            break
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)  # cuts the drain short

    try:
        status = proc.wait(timeout=REFUSED_WITHIN * 2)
    except subprocess.TimeoutExpired:  # where it hangs: faulthandler prints every stack
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=10)
        pytest.fail(f"not stopped by the second SIGINT:\n{proc.stderr.read()[-20_000:]}")
    assert status == 0
    assert time.monotonic() - started < REFUSED_WITHIN * 2
    assert "drain incomplete" in proc.stderr.read()


# -- helpers that make a store in a given state ------------------------------------------


def _make_store(state: Path, partitions: int) -> Path:
    """A store whose lease rows were created for ``partitions`` (real SQLite, no node)."""

    async def make() -> Path:
        store = await Store.open(state / "ratchet.db")
        try:
            await store.ensure_partitions(partitions)
        finally:
            await store.close()
        return state / "ratchet.db"

    return asyncio.run(make())


@contextmanager
def _read_only(path: Path) -> Iterator[None]:
    """The database file unwritable: immutable for root (which ignores modes), else 0444."""
    root = os.geteuid() == 0
    if root:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o444)
    try:
        yield
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o600)


# -- the drain's bound, in process ---------------------------------------------------------


async def test_a_stop_ends_within_its_drain_bound_while_a_step_never_returns(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    """The drain waits for tasks to reach a step boundary, but not for ever: past
    ``drain_timeout`` what is left is stopped, and the task stays RUNNING (it resumes from
    its checkpoint at the next start)."""
    entered = asyncio.Event()
    wf = ratchet.Workflow("hangs", step_timeout=None)  # unbounded: asked for

    @wf.step
    async def hang(ctx: ratchet.StepContext) -> dict[str, object]:
        entered.set()
        await asyncio.Event().wait()
        return {}

    node = await start_node(ratchet.Registry([wf]), drain_timeout=0.5)
    task_id = (await client.submit("hangs", {}, key="drain-1")).task_id
    await asyncio.wait_for(entered.wait(), 20)

    # The drain's bound, the root's second after an incomplete drain, closing: seconds.
    await asyncio.wait_for(node.stop(), 0.5 + 1 + 5)

    assert _task_status(node.config.db_path, task_id) == "RUNNING"


def _task_status(db: Path, task_id: str) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT status FROM tasks WHERE task_id = ?",
                                (task_id,)).fetchone()[0])
