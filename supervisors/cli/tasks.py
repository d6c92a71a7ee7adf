"""Commands about one task: submit, watch, status; and ``graph`` of a workflow."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ratchet.actors.transport.handles import TaskHandle
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.task_outcomes import (
    ResultTimeout,
    TaskCancelled,
    TaskError,
    TaskFailed,
    TaskHandedOff,
)
from ratchet.protocol.tracing import check_traceparent
from ratchet.supervisors.cli.common import ExitCode, connect, emit, load_app
from ratchet.supervisors.cli.output import watch_view

#: Exit codes of ``submit --wait`` and ``watch`` by how the task ended (0: it succeeded;
#: 2: a refused request, as for every command).
EXIT_FAILED = ExitCode.TASK_FAILED
EXIT_CANCELLED = ExitCode.TASK_CANCELLED
EXIT_HANDED_OFF = ExitCode.TASK_HANDED_OFF
EXIT_TIMEOUT = ExitCode.TIMEOUT
_EXIT_BY_ERROR: tuple[tuple[type[RatchetError], int], ...] = (
    (TaskFailed, EXIT_FAILED), (TaskCancelled, EXIT_CANCELLED),
    (TaskHandedOff, EXIT_HANDED_OFF), (ResultTimeout, EXIT_TIMEOUT))
_EXIT_BY_EVENT: dict[str, int] = {EventType.TASK_FAILED: EXIT_FAILED,
                                  EventType.TASK_CANCELLED: EXIT_CANCELLED}
#: Seconds ``watch`` waits for a task the node does not know yet (a JetStream submit may
#: still be on its way) before it says there is no such task.
MISSING_AFTER_S = 2.0


def submit_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("workflow")
    sp.add_argument("--input", default="{}", help="JSON object")
    sp.add_argument("--key", required=True, help="idempotency key of the business request")
    sp.add_argument("--version", type=int, default=None)
    sp.add_argument("--async", dest="fire_and_forget", action="store_true",
                    help="publish on JetStream and return at once: nothing validates it")
    sp.add_argument("--wait", action="store_true",
                    help="wait for the task's outcome and print it (exit 3 failed, 4"
                    " cancelled, 5 waiting for a human, 6 timed out)")
    sp.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                    help="with --wait: give up waiting after this long (the task goes on)")
    sp.add_argument("--sync", action="store_true", help=argparse.SUPPRESS)  # the default now
    sp.add_argument("--priority", type=int, default=0, choices=range(10), metavar="0-9",
                    help="higher is admitted first within the tenant's share (default 0)")
    sp.add_argument("--traceparent", type=_traceparent, default=os.environ.get("TRACEPARENT"),
                    metavar="00-TRACE-SPAN-FLAGS",
                    help="the W3C trace the task continues (default $TRACEPARENT; docs/protocol.md)")


def _traceparent(text: str) -> str:
    try:
        return check_traceparent(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def watch_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("task_id")
    sp.add_argument("--after", type=int, default=0, help="start after this sequence")
    sp.add_argument("--follow", action="store_true",
                    help="keep going after a terminal event (else watch ends there)")
    sp.add_argument("--sandbox", action="store_true",
                    help="a sandbox fork's events (ratchet.sandbox.events.>, docs/admin.md)")


def outcome_exit_code(error: RatchetError) -> int:
    """The exit code of a task's unsuccessful outcome (or of giving up waiting for it)."""
    return next((code for kind, code in _EXIT_BY_ERROR if isinstance(error, kind)), 2)


def _input_object(text: str) -> dict[str, Any] | None:
    """``--input`` as a JSON object; None after saying on stderr what is wrong with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        print(f"ratchet submit: --input is not valid JSON ({exc.msg} at line {exc.lineno}"
              f" column {exc.colno}); pass an object such as '{{\"amount\": 12}}'",
              file=sys.stderr)
        return None
    if not isinstance(data, dict):
        print("ratchet submit: --input must be a JSON object, such as '{\"amount\": 12}'",
              file=sys.stderr)
        return None
    return data


async def submit(args: argparse.Namespace) -> int:
    """Validated by the node (request/reply) unless ``--async`` (a JetStream publish nobody
    confirms); ``--wait`` then waits for the outcome and prints it."""
    data = _input_object(args.input)
    if data is None:
        return 2
    client = await connect(args, args.tenant)
    try:
        if args.fire_and_forget:
            handle = await client.submit(args.workflow, data, args.key, version=args.version,
                                         priority=args.priority, traceparent=args.traceparent)
            accepted: dict[str, Any] = {"task_id": handle.task_id, "tenant": handle.tenant}
        else:
            handle = await client.submit_sync(args.workflow, data, args.key,
                                              version=args.version, priority=args.priority,
                                              traceparent=args.traceparent)
            assert handle.accepted is not None
            accepted = {**handle.accepted.model_dump(), "tenant": handle.tenant}
        if not args.wait:
            emit(accepted)
            return 0
        return await _wait(handle, args.timeout)
    finally:
        await client.close()


async def _wait(handle: TaskHandle, timeout: float | None) -> int:
    try:
        output = await handle.result(timeout=timeout)
    except (TaskError, ResultTimeout) as exc:
        emit({"error": exc.to_wire()})
        return outcome_exit_code(exc)
    emit({"task_id": handle.task_id, "tenant": handle.tenant, "status": "SUCCEEDED",
          "output": output})
    return 0


async def watch(args: argparse.Namespace) -> int:
    """Ends at the task's terminal event (``--follow``: goes on); an unknown task is
    NOT_FOUND once ``MISSING_AFTER_S`` passed without it."""
    client = await connect(args, args.tenant)
    code = 0
    try:
        # JSON mode: each event as its JSON line; on a terminal, a line per event above a
        # progress bar fed by the task's progress events (supervisors/cli/output.py).
        with watch_view(args.task_id) as view:
            async for event in client.watch(args.task_id, after=args.after,
                                            follow_terminal=args.follow,
                                            missing_after=MISSING_AFTER_S,
                                            sandbox=args.sandbox):
                view.show(event)
                code = _EXIT_BY_EVENT.get(event.type, code)
    finally:
        await client.close()
    return code


async def status(args: argparse.Namespace) -> int:
    client = await connect(args, args.tenant)
    try:
        emit((await client.get(args.task_id)).model_dump())
    finally:
        await client.close()
    return 0


def graph(args: argparse.Namespace) -> int:
    workflow = load_app(args.app).get(args.workflow, args.version)
    if args.format in ("both", "table"):
        rows = [("from", "kind", "condition", "to"), *workflow.transition_table()]
        widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
        print(f"# {workflow.name} v{workflow.version}: start at {workflow.start}")
        for row in rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if args.format == "both":
        print()
    if args.format in ("both", "mermaid"):
        print(workflow.mermaid())
    return 0
