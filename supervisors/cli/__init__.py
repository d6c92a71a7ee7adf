"""``ratchet`` command line: serve, submit, watch, status, admin, schedule, creds,
nats-config, demo.

Where to find NATS: ``--nats-url``, else ``$RATCHET_NATS_URL``, else the URL an embedded
node wrote under its state directory (``<state-dir>/nats/nats.url``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ratchet.protocol.errors import (
    RatchetError,
    RemoteError,
    ToolDefinitionError,
    WorkflowDefinitionError,
)
from ratchet.supervisors.cli.admin import admin, issue, nats_config
from ratchet.supervisors.cli.common import emit, load_app
from ratchet.supervisors.cli.parser import parser
from ratchet.supervisors.cli.schedule import schedule
from ratchet.supervisors.cli.serve import serve
from ratchet.supervisors.cli.tasks import graph, status, submit, watch
from ratchet.supervisors.node.log_output import configure_logging

__all__ = ["configure_logging", "main", "load_app"]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(args.log_level)
    handlers = {
        "serve": serve,
        "submit": submit,
        "watch": watch,
        "status": status,
        "admin": admin,
        "creds": issue,
        "nats-config": nats_config,
        "schedule": schedule,
    }
    try:
        if args.command == "graph":
            return graph(args)
        if args.command == "demo":
            # Test components are loaded only for `ratchet demo`, never into a serving node.
            from ratchet.testing.demo import run_demo

            return asyncio.run(run_demo(Path(args.state_dir), args.nats_url))
        return asyncio.run(handlers[args.command](args))
    except RemoteError as exc:
        emit({"error": exc.to_wire() | {"code": exc.wire_code}})
        return 2
    except (WorkflowDefinitionError, ToolDefinitionError):
        # A bad app is a bug to fix: its traceback and exit 1 (docs/workflows.md), not the
        # one-line error of a refused request.
        raise
    except RatchetError as exc:
        emit({"error": exc.to_wire()})
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
