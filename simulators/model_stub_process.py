"""Run the OpenAI-compatible model stub as a child process (for tests and demos).

    with ModelStubProcess() as stub:
        stub.script([{"content": "hello"}])
        model = OpenAICompatibleModel(stub.url, "gpt-test")

No event loop needed: every method blocks.
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
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NoReturn
from urllib.parse import urlsplit

from simulators.process import SimulatorStartError

__all__ = ["ModelStubProcess", "SimulatorStartError"]

ROOT = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1

Json = dict[str, Any]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    # A test run killed hard must not leave an orphan stub behind.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ModelStubProcess:
    """One ``python -m simulators.model_stub`` child on a free loopback port.

    :meth:`start` returns the API URL (ending in ``/v1``); :meth:`stop` is idempotent; also
    a context manager. :meth:`script`, :meth:`faults`, :meth:`requests` and :meth:`reset`
    drive the stub's test controls (formats in :mod:`simulators.model_stub`).
    """

    def __init__(self, host: str = "127.0.0.1", *, verbose: bool = False) -> None:
        self.host = host
        self.verbose = verbose
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._url: str | None = None
        # Loopback must never go through an HTTP(S)_PROXY from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def url(self) -> str:
        """The stub's API root (``http://host:port/v1``); only valid while started."""
        if self._url is None:
            raise RuntimeError("the model stub is not running; call start() first")
        return self._url

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout: float = 10) -> str:
        """Spawn the server and wait for its ``{"url", "pid"}`` line; return the URL."""
        if self._url is not None:
            return self._url
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        command = [sys.executable, "-m", "simulators.model_stub", "--host", self.host,
                   "--port", "0"]
        if self.verbose:
            command.append("--verbose")
        # stderr goes to a file, not a pipe: nobody drains it, and a full pipe would block.
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        line = self._first_line(timeout)
        try:
            url = str(json.loads(line)["url"])
        except (ValueError, KeyError, TypeError):
            self._fail(f"the model stub announced something unexpected: {line!r}")
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

    def __enter__(self) -> ModelStubProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- test controls ---------------------------------------------------------------------

    def script(self, replies: list[Json]) -> None:
        """Append scripted replies (``{"content": ...}`` or ``{"tool_calls": [...]}``)."""
        self._control("POST", "/_script", {"replies": replies})

    def faults(self, rules: list[Json]) -> None:
        """Append fault rules (``{"mode": ..., "times": 1, "retry_after": 1.0, ...}``)."""
        self._control("POST", "/_faults", {"rules": rules})

    def requests(self) -> list[Json]:
        """Every chat request received: ``[{"authorized": bool, "body": {...}}, ...]``."""
        return list(self._control("GET", "/_requests")["requests"])

    def reset(self) -> None:
        """Forget the script, the faults and the request log."""
        self._control("POST", "/_reset")

    # -- helpers ---------------------------------------------------------------------------

    def _control(self, method: str, path: str, body: Json | None = None) -> Json:
        parts = urlsplit(self.url)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{parts.scheme}://{parts.netloc}{path}", data=data,
                                         method=method)
        request.add_header("Content-Type", "application/json")
        with self._opener.open(request, timeout=10) as response:
            reply = json.loads(response.read())
        if not isinstance(reply, dict):
            raise RuntimeError(f"the model stub answered {path} with {reply!r}")
        return reply

    def _first_line(self, timeout: float) -> str:
        """The child's first stdout line, read on a thread so the wait can time out."""
        assert self._proc is not None and self._proc.stdout is not None
        lines: queue.Queue[bytes] = queue.Queue()
        stdout = self._proc.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            self._fail(f"the model stub did not announce its URL within {timeout} s")
        if not line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._fail(f"the model stub exited with code {self._proc.returncode}")
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
        raise SimulatorStartError(f"{why}\n--- model stub stderr ---\n{detail}" if detail else why)
