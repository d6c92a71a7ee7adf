"""The command line as a person meets it: options after their command, one-line usage
errors with exit 2, JSON when piped, tables and colours on a terminal, log lines that
suit where they go. Each runs the installed ``ratchet`` entry point in a subprocess; a
terminal is a pseudo-terminal (``pty``)."""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

import ratchet
from ratchet.protocol.messages import Event
from ratchet.supervisors.cli.human import HumanOutput
from ratchet.supervisors.cli.output import Output
from ratchet.supervisors.cli.render import event_line, relative_time, render_answer
from tests.conftest import RATCHET_BIN, ROOT

#: A terminal's environment: a known width, colours allowed.
TERMINAL_ENV = {"COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}


def _ratchet(*args: str, env: dict[str, str] | None = None,
             cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RATCHET_BIN), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def _on_a_terminal(*argv: str) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; its exit code and what
    the terminal showed."""
    main, child = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=child, stderr=child,
                            stdin=subprocess.DEVNULL, env={**environ, **TERMINAL_ENV})
    os.close(child)
    shown = bytearray()
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(main)
    return proc.wait(timeout=60), shown.decode(errors="replace")


def _ratchet_on_a_terminal(*args: str) -> tuple[int, str]:
    return _on_a_terminal(str(RATCHET_BIN), *args)


# -- options after their command ----------------------------------------------------------


def test_the_options_of_every_command_are_listed_in_each_commands_help() -> None:
    for command in ("serve", "submit", "status", "admin", "graph"):
        shown = _ratchet(command, "--help")
        assert shown.returncode == 0, shown.stderr
        for option in ("--state-dir", "--log-level", "--output"):
            assert option in shown.stdout, (command, option)


def test_state_dir_and_log_level_work_after_the_command_and_after_wins(tmp_path: Path) -> None:
    """A client with no NATS URL names the URL file it looked for: under the state dir it
    was given, wherever the option was."""
    before, after = tmp_path / "before", tmp_path / "after"
    for argv in (["--state-dir", str(after), "status", "tsk_x"],
                 ["status", "tsk_x", "--state-dir", str(after), "--log-level", "debug"],
                 ["--state-dir", str(before), "status", "tsk_x", "--state-dir", str(after)]):
        done = _ratchet(*argv, env={"RATCHET_NATS_URL": ""})
        assert done.returncode == 2, (argv, done.stderr)
        assert str(after / "nats" / "nats.url") in done.stderr, (argv, done.stderr)
        assert str(before) not in done.stderr


# -- usage errors -------------------------------------------------------------------------

USAGE_ERRORS = {
    "input is not JSON": (["submit", "expense.report", "--key", "k", "--input", '{"items": [1,'],
                          "not valid JSON"),
    "input is not an object": (["submit", "expense.report", "--key", "k", "--input", "[1]"],
                               "must be a JSON object"),
    "log level after the command": (["serve", "--app", "examples.report:app", "--log-level",
                                     "verbose"], "unknown level 'verbose'"),
    "log level before the command": (["--log-level", "verbose", "status", "tsk_x"],
                                     "unknown level 'verbose'"),
    "app module missing": (["serve", "--app", "no_such_flows:app"],
                           "no module named 'no_such_flows'"),
    "app attribute missing": (["serve", "--app", "examples.report:apq"],
                              "has no attribute 'apq'"),
    "app without an attribute": (["serve", "--app", "examples.report"],
                                 "is not module:object"),
    "app of the wrong kind": (["graph", "x", "--app", "examples.report:asyncio"],
                              "not a Registry"),
    "admin args not an object": (["admin", "list", "--args", "[1]"], "must be a JSON object"),
    "admin arg without =": (["admin", "cancel", "tsk_x", "--arg", "typo"], "is not KEY=VALUE"),
    "unknown option": (["status", "tsk_x", "--colour"], "unrecognized arguments: --colour"),
}


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_a_usage_error_is_one_line_that_says_what_to_do_and_exits_2(case: str) -> None:
    argv, expected = USAGE_ERRORS[case]
    done = _ratchet(*argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert expected in line and line.startswith("ratchet"), line
    assert "Traceback" not in done.stderr


def test_a_log_level_from_the_environment_is_checked_too() -> None:
    done = _ratchet("status", "tsk_x", env={"RATCHET_LOG_LEVEL": "verbose"})
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "unknown level 'verbose'" in line


def test_an_app_whose_own_import_fails_keeps_its_traceback_and_exits_1(tmp_path: Path) -> None:
    """A module that is found but imports a missing one is a bug in the app, not a typo."""
    (tmp_path / "brokenflows.py").write_text("import no_such_dependency\napp = None\n")
    done = _ratchet("graph", "x", "--app", "brokenflows:app", cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "no_such_dependency" in done.stderr


# -- output: JSON when piped, tables on a terminal ----------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A ``ratchet serve`` of the example workflow, and one task of it that SUCCEEDED."""
    state = tmp_path / "state"
    serve = subprocess.Popen([str(RATCHET_BIN), "serve", "--app", "examples.report:app",
                              "--state-dir", str(state), "--log-level", "warning"],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        assert "serving" in json.loads(serve.stdout.readline())
        submitted = _ratchet("submit", "expense.report", "--key", "r-1", "--sync", "--input",
                             json.dumps({"items": [{"what": "taxi", "amount": 30}]}),
                             "--state-dir", str(state))
        task_id = json.loads(submitted.stdout)["task_id"]
        watched = _ratchet("watch", task_id, "--state-dir", str(state))
        assert json.loads(watched.stdout.splitlines()[-1])["type"] == "task.succeeded"
        yield state, task_id
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


@pytest.mark.slow
def test_answers_are_json_lines_when_piped_and_tables_on_a_terminal(
        served: tuple[Path, str]) -> None:
    state, task_id = served
    piped = _ratchet("status", task_id, "--state-dir", str(state))
    assert json.loads(piped.stdout)["status"] == "SUCCEEDED"  # one JSON object, as before

    code, shown = _ratchet_on_a_terminal("status", task_id, "--state-dir", str(state))
    assert code == 0, shown
    assert "SUCCEEDED" in shown and "ago" in shown and "\x1b[" in shown  # relative, coloured
    with pytest.raises(json.JSONDecodeError):
        json.loads(shown)

    code, shown = _ratchet_on_a_terminal("admin", "list", "--state-dir", str(state))
    assert code == 0 and task_id in shown and "tasks" in shown and "ago" in shown, shown
    code, shown = _ratchet_on_a_terminal("status", task_id, "--state-dir", str(state),
                                         "--output", "json")
    assert code == 0 and json.loads(shown)["task_id"] == task_id
    asked = _ratchet("status", task_id, "--state-dir", str(state), "--output", "human")
    assert "SUCCEEDED" in asked.stdout and not asked.stdout.startswith("{")

    # watch of a finished task: its events, each a line above a bar that ends full
    code, shown = _ratchet_on_a_terminal("watch", task_id, "--state-dir", str(state))
    assert code == 0 and "task.succeeded" in shown and "━" in shown, shown
    piped_watch = _ratchet("watch", task_id, "--state-dir", str(state))
    lines = piped_watch.stdout.strip().splitlines()
    assert json.loads(lines[-1])["type"] == "task.succeeded" and "━" not in piped_watch.stdout

    code, shown = _ratchet_on_a_terminal("status", "tsk_nope", "--state-dir", str(state))
    assert code == 2 and "NOT_FOUND" in shown and len(shown.strip().splitlines()) == 1, shown
    refused = _ratchet("status", "tsk_nope", "--state-dir", str(state))
    assert refused.returncode == 2 and json.loads(refused.stdout)["error"]["code"] == "NOT_FOUND"


# -- rendering, without a terminal ----------------------------------------------------------


def _text(renderable: object) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_relative_times_read_as_a_person_says_them() -> None:
    now = 1_000_000.0
    assert relative_time(now - 0.3, now) == "just now"
    assert relative_time(now - 3.9, now) == "3 s ago"
    assert relative_time(now - 300, now) == "5 min ago"
    assert relative_time(now - 7300, now) == "2 h ago"
    assert relative_time(now - 4 * 86400, now) == "4 d ago"
    assert relative_time(now + 10, now) == "in 10 s"


def test_a_list_answer_is_a_table_with_times_relative_and_values_never_markup() -> None:
    now = time.time()
    answer = {"tasks": [{"task_id": "tsk_a", "status": "RUNNING", "created_at": now - 120},
                        {"task_id": "[bold]tsk_b[/]", "status": "FAILED",
                         "created_at": now - 5}],
              "next_cursor": None}
    shown = _text(render_answer(answer, now))
    assert "tasks" in shown and "2 min ago" in shown and "5 s ago" in shown
    assert "[bold]tsk_b[/]" in shown  # shown as written, not read as rich markup
    assert "next_cursor" in shown


def test_stored_events_read_as_watch_shows_them_and_key_lists_as_words() -> None:
    now = time.time()
    history = {"task_id": "tsk_a", "next_after": None, "events": [
        {"sequence": 1, "event_id": "evt_1", "type": "task.queued", "aggregate_version": 1,
         "occurred_at": now - 2, "payload": {"workflow": "expense.report"}}]}
    shown = _text(render_answer(history, now))
    assert "1" in shown and "task.queued" in shown and "workflow=expense.report" in shown
    assert "evt_1" not in shown  # a line per event, not a table of every field
    keys = {"keys": [{"name": "ann", "roles": ["approver", "viewer"], "expired": False}]}
    assert "approver, viewer" in _text(render_answer(keys, now))


def _event(sequence: int, type_: str, **payload: object) -> Event:
    return Event(event_id=f"evt_{sequence}", task_id="tsk_a", tenant="t", sequence=sequence,
                 type=type_, aggregate_version=sequence, occurred_at=time.time(),
                 producer="n1", payload=payload)


WATCHED = [_event(1, "task.queued"), _event(2, "task.started"),
           _event(3, "step.completed", step="load", index=0),
           _event(4, "task.progress", node="total", steps_completed=1, steps_total=4),
           _event(5, "step.completed", step="total", index=1),
           _event(6, "task.succeeded", output={"total": 12})]


def test_watch_on_a_terminal_shows_a_line_per_event_above_a_bar_that_ends_full() -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=120, force_terminal=True, color_system=None)
    with HumanOutput(console, console).watch_view("tsk_a") as view:
        for event in WATCHED:
            view.show(event)
    shown = screen.getvalue()
    assert all(event.type in shown for event in WATCHED)
    assert "step=load" in shown and "4/4" in shown and "tsk_a SUCCEEDED" in shown


def test_watch_into_a_pipe_prints_each_event_as_its_json_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with Output().watch_view("tsk_a") as view:
        for event in WATCHED:
            view.show(event)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [json.loads(event.model_dump_json()) for event in WATCHED]


def test_an_event_line_shows_sequence_type_and_payload() -> None:
    event = Event(event_id="evt_1", task_id="tsk_a", tenant="t", sequence=7,
                  type="step.completed", aggregate_version=3, occurred_at=time.time(),
                  producer="n1", payload={"step": "total", "index": 2})
    line = event_line(event).plain
    assert line.split()[0] == "7" and "step.completed" in line
    assert "step=total" in line and "index=2" in line


# -- logs: JSON lines when piped, readable lines on a terminal ----------------------------

LOGGING_SCRIPT = """
import asyncio, logging, structlog
from ratchet.supervisors.node.log_output import configure_logging
configure_logging("info")
log = structlog.get_logger("ratchet.test")
try:
    raise ValueError("the cause")
except ValueError:
    log.exception("step failed", task_id="tsk_a")
logging.getLogger("asyncio").warning("from the standard library %s", "asyncio")
log.debug("not shown at info")
"""


def test_logs_are_json_lines_with_the_traceback_when_piped() -> None:
    done = subprocess.run([sys.executable, "-c", LOGGING_SCRIPT], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    failed, stdlib = lines
    assert failed["event"] == "step failed" and failed["task_id"] == "tsk_a"
    assert "ValueError: the cause" in failed["exception"] and failed["level"] == "error"
    assert stdlib["event"] == "from the standard library asyncio"
    assert stdlib["logger"] == "asyncio" and stdlib["level"] == "warning"


def test_logs_are_coloured_lines_with_a_drawn_traceback_on_a_terminal() -> None:
    code, text = _on_a_terminal(sys.executable, "-c", LOGGING_SCRIPT)
    assert code == 0, text
    assert "step failed" in text and "\x1b[" in text and "Traceback" in text
    assert "the cause" in text and "from the standard library asyncio" in text
    assert "not shown" not in text
    assert '{"event"' not in text


WITHOUT_RICH = """
import sys
import ratchet.__main__ as entry
entry._structlog_without_rich()
import structlog
from ratchet.supervisors.node.log_output import configure_logging
configure_logging("info", console=True)  # a console rendering all the same: no rich needed
try:
    raise ValueError("the cause")
except ValueError:
    structlog.get_logger("t").exception("step failed")
print("rich" in sys.modules, structlog.dev.rich is None)
import rich.console  # the commands that print for people import it as usual
print("rich" in sys.modules)
"""


def test_the_command_imports_structlog_without_rich_when_its_logs_are_json_lines() -> None:
    """stderr piped (JSON log lines): rich, ~50 ms of imports, is never loaded for the logs
    (ratchet/__main__.py); a console rendering configured anyway draws the standard
    library's traceback."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_RICH], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]
    assert "Traceback" in done.stderr and "ValueError: the cause" in done.stderr


def test_version_prints_the_installed_distributions_version() -> None:
    done = subprocess.run([str(RATCHET_BIN), "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"ratchet {ratchet.__version__}"
