"""Run the finance simulator as a child process (for tests, benchmarks and demos).

    with FinanceSimulatorProcess() as sim:
        client = FinanceClient(sim.url)

No event loop needed: start() and stop() block.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from types import TracebackType
from typing import IO, NoReturn, Self

__all__ = ["FinanceSimulatorProcess", "SimulatorProcess", "SimulatorStartError"]

_PR_SET_PDEATHSIG = 1


class SimulatorStartError(RuntimeError):
    """The simulator process exited or stayed silent instead of announcing its URL."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    # A test run killed hard must not leave an orphan simulator behind.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class SimulatorProcess:
    """One ``python -m <module>`` simulator child on a free loopback port.

    :meth:`start` returns the URL it announces; :meth:`stop` is idempotent; also a context
    manager. Subclasses name the module (and add their test controls).
    """

    module = ""
    label = "simulator"

    def __init__(self, host: str = "127.0.0.1", *, verbose: bool = False) -> None:
        self.host = host
        self.verbose = verbose
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The simulator's base URL; only valid while started."""
        if self._url is None:
            raise RuntimeError(f"the {self.label} is not running; call start() first")
        return self._url

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout: float = 10) -> str:
        """Spawn the server and wait for its ``{"url", "pid"}`` line; return the URL."""
        if self._url is not None:
            return self._url
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        command = [sys.executable, "-m", self.module, "--host", self.host, "--port", "0"]
        if self.verbose:
            command.append("--verbose")
        # stderr goes to a file, not a pipe: nobody drains it, and a full pipe would block.
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        line = self._first_line(timeout)
        try:
            announced = json.loads(line)
            url = str(announced["url"])
        except (ValueError, KeyError, TypeError):
            self._fail(f"the {self.label} announced something unexpected: {line!r}")
        self._url = url
        return url

    def stop(self) -> None:
        """SIGTERM, wait up to 5 s, then SIGKILL. Safe to call more than once."""
        proc, self._proc, self._url = self._proc, None, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helpers ---------------------------------------------------------------------------

    def _first_line(self, timeout: float) -> str:
        """The child's first stdout line, read on a thread so the wait can time out."""
        assert self._proc is not None and self._proc.stdout is not None
        lines: queue.Queue[bytes] = queue.Queue()
        stdout = self._proc.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            self._fail(f"the {self.label} did not announce its URL within {timeout} s")
        if not line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._fail(f"the {self.label} exited with code {self._proc.returncode}")
        return line.decode(errors="replace").strip()

    def _fail(self, why: str) -> NoReturn:
        """Stop the child and raise, quoting what it wrote to stderr."""
        errors = b""
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.seek(0)
                errors = self._stderr.read()[-4000:]
        self.stop()
        detail = errors.decode(errors="replace").strip()
        raise SimulatorStartError(f"{why}\n--- {self.label} stderr ---\n{detail}" if detail
                                  else why)


class FinanceSimulatorProcess(SimulatorProcess):
    """The finance-system simulator (:mod:`ratchet.testing.finance`) as a child process."""

    module = "ratchet.testing.finance"
    label = "finance simulator"
