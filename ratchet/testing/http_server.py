"""What the simulator servers share: a threaded loopback HTTP server, JSON replies, and the
``python -m`` entry point that announces ``{"url", "pid"}`` and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, cast

__all__ = ["JsonHandler", "SimulatorServer", "serve_main"]

Json = dict[str, Any]


class SimulatorServer(ThreadingHTTPServer):
    """The HTTP server; subclasses set their ``state`` (shared by all handler threads)."""

    daemon_threads = True
    # The socketserver default backlog (5) resets connections under 32+ concurrent clients,
    # which would look like network faults nobody injected.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 verbose: bool = False) -> None:
        self.verbose = verbose
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out or vanish mid-reply are part of the game, not server errors.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class JsonHandler(BaseHTTPRequestHandler):
    """Request logging only with ``--verbose``, and JSON replies."""

    def log_message(self, format: str, *args: Any) -> None:
        if cast(SimulatorServer, self.server).verbose:
            super().log_message(format, *args)

    def _reply(
        self, status: int, payload: Json | bytes, headers: dict[str, str] | None = None
    ) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client already gave up (e.g. timed out on a slow fault)
            self.close_connection = True


def serve_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str | None,
    make_server: Callable[[tuple[str, int], bool], ThreadingHTTPServer],
    url_path: str = "",
    formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter,
) -> int:
    """Serve until SIGTERM/SIGINT; announce ``{"url", "pid"}`` on stdout once listening."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=formatter_class)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--verbose", action="store_true", help="log requests to stderr")
    args = parser.parse_args(argv)

    server = make_server((args.host, args.port), args.verbose)
    port = server.server_address[1]

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return, and serve_forever() runs on this
        # very (main) thread: ask from another thread or it would deadlock.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"url": f"http://{args.host}:{port}{url_path}", "pid": os.getpid()}),
          flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0
