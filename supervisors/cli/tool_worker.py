"""``ratchet tool-worker --app module:object``: serve tools to Ratchet nodes from this
process (actors/effects/tool_worker.py; docs/protocol.md, "Serving a tool from another
process or language").

``object`` is a tool (``served_by(remote_tool(...), fn)`` or ``@ratchet.tool``) or a list
of them. Prints one JSON line ``{"serving": [...], "tenants": [...], "pid": n}`` once its
consumers are bound, then serves until SIGINT or SIGTERM (requests in progress finish; the
rest are redelivered to another worker).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import signal
import sys
from typing import Any

from ratchet.actors.effects.tool_worker import ToolWorker
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.errors import UsageError
from ratchet.supervisors.cli.common import nats_url
from ratchet.supervisors.node.nats_auth import nats_auth_options

__all__ = ["load_tools", "tool_worker"]


def load_tools(spec: str) -> list[Tool[Any, Any]]:
    """The tools ``module:object`` names. Raises UsageError."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--app {spec!r} is not module:object")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    found = getattr(importlib.import_module(module_name), attr, None)
    tools = [found] if isinstance(found, Tool) else list(found or [])
    if not tools or not all(isinstance(t, Tool) for t in tools):
        raise UsageError(f"--app {spec!r} is not a tool or a list of tools")
    return tools


async def tool_worker(args: argparse.Namespace) -> int:
    tools = load_tools(args.app)
    worker = ToolWorker(
        nats_url(args), tools, args.tenant or ["default"], max_in_flight=args.max_in_flight,
        ack_wait=args.ack_wait, max_deliver=args.max_deliver, worker_id=args.worker_id,
        connect_options=nats_auth_options(args.nats_creds) if args.nats_creds else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    try:
        print(json.dumps({"serving": sorted(worker.tools), "tenants": worker.tenants,
                          "pid": os.getpid(), "worker_id": worker.worker_id}), flush=True)
        await stop.wait()
    finally:
        await worker.stop()
    return 0
