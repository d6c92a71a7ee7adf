"""``ratchet`` command line: serve, submit, watch, status, admin, schedule, versions, creds,
nats-config, console-login, replay, export, tool-worker, demo.

Where to find NATS: ``--nats-url``, else ``$RATCHET_NATS_URL``, else the URL an embedded
node wrote under its state directory (``<state-dir>/nats/nats.url``).

How it prints: ``cli/output.py`` (``--output``); what its exit status means:
:class:`~ratchet.supervisors.cli.common.ExitCode` and docs/cli.md.
"""

from __future__ import annotations

# First, before anything imports nats-py: aiohttp is imported at its first use.
import ratchet.supervisors.cli.deferred_imports  # noqa: F401

# isort: split
import argparse
import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ratchet.protocol.errors import (
    RatchetError,
    RemoteError,
    ToolDefinitionError,
    UsageError,
    WorkflowDefinitionError,
)
from ratchet.supervisors.cli.common import ExitCode, load_app
from ratchet.supervisors.cli.output import set_output, show_error, show_usage_error
from ratchet.supervisors.cli.parser import parser
from ratchet.supervisors.cli.startup_gc import release as release_gc
from ratchet.supervisors.node.log_output import configure_logging

__all__ = ["ExitCode", "configure_logging", "main", "load_app"]

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def _async_command(name: str) -> Command:
    """The coroutine function of an event-loop command, its module imported now: a command
    loads only its own (``serve`` neither the client commands nor the console's login)."""
    if name == "serve":
        from ratchet.supervisors.cli.serve import serve

        return serve
    if name in ("submit", "watch", "status"):
        from ratchet.supervisors.cli import tasks

        return {"submit": tasks.submit, "watch": tasks.watch, "status": tasks.status}[name]
    if name in ("diagnose", "admin", "creds", "nats-config"):
        from ratchet.supervisors.cli import admin

        return {"diagnose": admin.diagnose, "admin": admin.admin, "creds": admin.issue,
                "nats-config": admin.nats_config}[name]
    if name == "schedule":
        from ratchet.supervisors.cli.schedule import schedule

        return schedule
    if name == "tool-worker":
        from ratchet.supervisors.cli.tool_worker import tool_worker

        return tool_worker
    if name in ("replay", "export"):
        from ratchet.supervisors.cli import replay

        return replay.replay_command if name == "replay" else replay.export_command
    from ratchet.supervisors.cli.versions import versions

    return versions


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit status."""
    if args.command != "serve":
        release_gc()  # held by the command's entry point until a node serves
    if args.command == "graph":
        from ratchet.supervisors.cli.tasks import graph

        return graph(args)
    if args.command == "console-login":
        from ratchet.supervisors.cli.admin import console_login

        return console_login(args)
    if args.command == "demo":
        # Test components are loaded only for `ratchet demo`, never into a serving node.
        from ratchet.testing.demo import run_demo

        return asyncio.run(run_demo(Path(args.state_dir), args.nats_url))
    return asyncio.run(_async_command(args.command)(args))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # a usage error: one line, exit 2
    set_output(args.output)
    configure_logging(args.log_level)
    try:
        return run(args)
    except UsageError as exc:
        show_usage_error(f"ratchet {args.command}", exc.message)
        return ExitCode.USAGE
    except RemoteError as exc:
        show_error(exc.to_wire() | {"code": exc.wire_code})
        return ExitCode.USAGE
    except (WorkflowDefinitionError, ToolDefinitionError):
        # A bad app is a bug to fix: its traceback and exit 1 (docs/workflows.md), not the
        # one-line error of a refused request.
        raise
    except RatchetError as exc:
        show_error(exc.to_wire())
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
