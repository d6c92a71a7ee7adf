"""``ratchet serve``'s observability: the ``--metrics-port``, ``--metrics-host`` and
``--ready-timeout`` flags, the endpoints' server, and the bounded wait for the node to be
ready (docs/operations.md, "Health"); and the web console's flags."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from ratchet.supervisors.node.node import Node
from ratchet.supervisors.observability.health import readiness

if TYPE_CHECKING:
    from ratchet.supervisors.observability.http import Observability

__all__ = ["console_flags", "observability_flags", "observability_for", "until_ready"]

#: How often the wait for readiness looks again (readiness is a pure read of the node).
_LOOK_EVERY = 0.05


def console_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--console-port", type=int, default=None, metavar="PORT",
                   help="serve the web console on this port (default: off; 0: a free one)")
    s.add_argument("--console-host", default="127.0.0.1",
                   help="the console's address (default loopback; docs/security.md)")


def observability_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                   help="serve /metrics (Prometheus), /healthz and /readyz on this port"
                   " (default 0: off)")
    s.add_argument("--metrics-host", default="127.0.0.1", metavar="ADDRESS",
                   help="the address --metrics-port binds (default 127.0.0.1; 0.0.0.0 for"
                   " a Prometheus on another host)")
    s.add_argument("--ready-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="exit with status 15 (NOT_READY) when the node is not ready this"
                   " long after it began to start")
    s.add_argument("--otel", action="store_true",
                   help="OpenTelemetry traces to the OTLP exporter the OTEL_* variables"
                   " configure (also on when OTEL_TRACES_EXPORTER or"
                   " OTEL_EXPORTER_OTLP_ENDPOINT is set)")


def observability_for(node: Node) -> Observability | None:
    """The endpoints' server the node's config asks for (None: ``--metrics-port 0``)."""
    cfg = node.config
    if not cfg.metrics_port:
        return None
    # Imported only for a metrics port: aiohttp and prometheus_client (docs/operations.md,
    # "Restart (W4)").
    from ratchet.supervisors.observability.http import Observability

    return Observability(node, cfg.metrics_port, cfg.metrics_host)


async def until_ready(node: Node, timeout: float) -> bool:
    """Wait until the node is ready; False when ``timeout`` passed first or it failed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not readiness(node).ready:
        if node.failed.is_set() or loop.time() >= end:
            return False
        await asyncio.sleep(_LOOK_EVERY)
    return True
