"""The node's observability port (``serve --metrics-port``): ``/metrics``, ``/healthz``,
``/readyz`` over aiohttp (docs/operations.md, "Metrics" and "Health").

Started before the node (so that ``/healthz`` answers, and ``/readyz`` says "starting",
while it starts) and stopped after it. Read-only and unauthenticated, like every
Prometheus endpoint: it binds 127.0.0.1 unless ``--metrics-host`` says otherwise, and shows
counts, tenant names and ages — never a task's data.
"""

from __future__ import annotations

import json

import structlog
from aiohttp import web

from ratchet.protocol.errors import UsageError
from ratchet.supervisors.node.node import Node
from ratchet.supervisors.observability.event_figures import EventFigures
from ratchet.supervisors.observability.health import readiness
from ratchet.supervisors.observability.metrics import CONTENT_TYPE_LATEST, scrape

__all__ = ["Observability"]

log = structlog.get_logger("ratchet.metrics")


class Observability:
    """One node's metrics and health endpoints.

    Args:
        node: the node observed (read only; it may not have started yet).
        port: the TCP port (0: any free one, see :attr:`port` once started).
        host: the address to bind.
    """

    def __init__(self, node: Node, port: int, host: str = "127.0.0.1") -> None:
        self.node = node
        self.host = host
        self.port = port
        self.events = EventFigures()
        self._runner: web.AppRunner | None = None
        self._watching = False

    async def start(self) -> None:
        """Listen.

        Raises:
            UsageError: the address cannot be bound (the port is taken, the host unknown).
        """
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise UsageError(f"--metrics-port {self.port} on {self.host}: {exc.strerror or exc}"
                             ) from None
        self._runner = runner
        server = site._server  # aiohttp keeps the listening sockets there
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("metrics serving", url=f"http://{self.host}:{self.port}/metrics")

    def watch(self) -> None:
        """Count events as the node commits them (call once its store is open)."""
        if not self._watching and self.node.store is not None:
            self.node.store.add_outbox_listener(self.events)
            self._watching = True

    async def stop(self) -> None:
        """Idempotent."""
        if self._watching and self.node.store is not None:
            self.node.store.remove_outbox_listener(self.events)
            self._watching = False
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _metrics(self, _: web.Request) -> web.Response:
        body = await scrape(self.node, self.events)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        # Up is the process answering; a node that failed is on its way out (serve exits 1).
        failed = self.node.failed.is_set()
        return web.json_response({"status": "failed" if failed else "up",
                                  "node_id": self.node.config.node_id},
                                 status=503 if failed else 200)

    async def _readyz(self, _: web.Request) -> web.Response:
        state = readiness(self.node)
        return web.Response(text=json.dumps(state.to_json()), content_type="application/json",
                            status=200 if state.ready else 503)
