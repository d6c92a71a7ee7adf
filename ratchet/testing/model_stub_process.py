"""Run the OpenAI-compatible model stub as a child process (for tests and demos).

    with ModelStubProcess() as stub:
        stub.script([{"content": "hello"}])
        model = OpenAICompatibleModel(stub.url, "gpt-test")

No event loop needed: every method blocks.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from ratchet.testing.process import SimulatorProcess, SimulatorStartError

__all__ = ["ModelStubProcess", "SimulatorStartError"]

Json = dict[str, Any]


class ModelStubProcess(SimulatorProcess):
    """One ``python -m ratchet.testing.model_stub`` child on a free loopback port.

    :meth:`start` returns the API URL (ending in ``/v1``); :meth:`stop` is idempotent; also
    a context manager. :meth:`script`, :meth:`faults`, :meth:`requests` and :meth:`reset`
    drive the stub's test controls (formats in :mod:`ratchet.testing.model_stub`).
    """

    module = "ratchet.testing.model_stub"
    label = "model stub"

    def __init__(self, host: str = "127.0.0.1", *, verbose: bool = False) -> None:
        super().__init__(host, verbose=verbose)
        # Loopback must never go through an HTTP(S)_PROXY from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

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
