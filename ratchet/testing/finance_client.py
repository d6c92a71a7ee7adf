"""A blocking client of the finance simulator, written the way tool code talks to a provider.

It runs on a worker thread (urllib, no event loop) and turns every failure into one of the
runtime's tool errors, so a retry policy can tell "safe to resend" from "may have happened":

=========================================  ===================================================
HTTP 400 (and other 4xx)                   :class:`~protocol.errors.ToolInvalidArgument`
HTTP 403                                   :class:`~protocol.errors.ToolPermissionDenied`
HTTP 409                                   :class:`~protocol.errors.ToolConflict`
HTTP 429                                   :class:`~protocol.errors.ToolRateLimited`
                                           (``retry_after`` from Retry-After, default 1.0)
HTTP 500/502/503/504, connection refused   :class:`~protocol.errors.ToolTransient`
timeout, reset, disconnect, short read,    :class:`~protocol.errors.ToolOutcomeUnknown`
anything else once the request went out
=========================================  ===================================================

:meth:`FinanceClient.query` is a read: any failure but "not found" is ToolTransient.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ratchet.protocol.errors import (
    ToolConflict,
    ToolError,
    ToolInvalidArgument,
    ToolOutcomeUnknown,
    ToolPermissionDenied,
    ToolRateLimited,
    ToolTransient,
)
from ratchet.protocol.retry_after import retry_after_seconds

__all__ = ["FinanceClient"]

Json = dict[str, Any]

_TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})


class FinanceClient:
    """Blocking HTTP client for ``ratchet.testing.finance``.

    Args:
        base_url: the simulator's URL, e.g. ``http://127.0.0.1:8123``.
        timeout: seconds for connecting and for each socket read.

    The write methods take an optional ``headers`` mapping sent as extra HTTP headers, e.g.
    ``{"X-Permission": "deny"}`` to make the provider refuse with 403.
    """

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # Loopback must never go through an HTTP(S)_PROXY from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # -- provider operations (tool code) ------------------------------------------------------

    def submit_claim(
        self, key: str, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> Json:
        """File an expense claim once per ``key``. Returns the provider's result; its
        ``status`` is "completed", or "pending" when the provider only accepted it (202)."""
        return self._write("/claims", key, body, headers)

    def refund(
        self, key: str, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> Json:
        """Issue a refund once per ``key`` (also the compensation of a claim)."""
        return self._write("/refunds", key, body, headers)

    def query(self, key: str) -> Json | None:
        """The stored result of the action with this key, or None if the provider has none.

        This is how an unknown outcome is reconciled. Raises ToolTransient on any failure.
        """
        try:
            status, reply = self._send("GET", f"/actions/{quote(key, safe='')}")
        except ToolError as err:
            if err.details.get("status") == 404:
                return None
            if isinstance(err, ToolTransient):
                raise
            raise ToolTransient(f"query failed: {err.message}", key=key) from err
        result = reply.get("result")
        if status != 200 or not isinstance(result, dict):
            raise ToolTransient(f"query got an unexpected reply ({status})", key=key)
        return result

    # -- admin helpers (tests, benchmarks, demos) ------------------------------------------

    def add_faults(self, rules: list[Json]) -> None:
        """Append fault rules (format in ``ratchet.testing.finance``)."""
        self._admin("POST", "/_faults", {"rules": rules})

    def clear_faults(self) -> None:
        self._admin("DELETE", "/_faults")

    def effects(self) -> dict[str, int]:
        """How many times each key's action actually took effect."""
        return dict(self._admin("GET", "/_effects")["effects"])

    def requests(self) -> dict[str, int]:
        """How many requests each provider operation received (claims, refunds, query)."""
        return dict(self._admin("GET", "/_effects")["requests"])

    def actions(self) -> dict[str, Json]:
        """Every stored result by idempotency key."""
        return dict(self._admin("GET", "/_effects")["actions"])

    def confirm(self, key: str) -> Json:
        """Complete a pending (accepted) action; returns its result."""
        return self._admin("POST", f"/_confirm/{quote(key, safe='')}")

    def reset(self) -> None:
        """Forget all actions, effects, faults and id counters."""
        self._admin("POST", "/_reset")

    def health(self) -> bool:
        """True when the simulator answers its health check."""
        try:
            return self._admin("GET", "/_health").get("ok") is True
        except ToolError:
            return False

    # -- plumbing --------------------------------------------------------------------------

    def _write(
        self, path: str, key: str, body: Mapping[str, Any], headers: Mapping[str, str] | None
    ) -> Json:
        payload = {**body, "idempotency_key": key}
        extra = {**(headers or {}), "Idempotency-Key": key}
        return self._send("POST", path, payload, extra, key=key)[1]

    def _admin(self, method: str, path: str, body: Json | None = None) -> Json:
        try:
            return self._send(method, path, body)[1]
        except ToolTransient:
            raise
        except ToolError as err:  # admin calls are reads or idempotent: plain retryable
            if isinstance(err, ToolOutcomeUnknown):
                raise ToolTransient(err.message, **err.details) from err
            raise

    def _send(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        key: str | None = None,
    ) -> tuple[int, Json]:
        """One HTTP exchange; returns (status, JSON reply) for 2xx, raises a ToolError else."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        where = f"{method} {path}"
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as err:
            raise _http_error(err, where, key) from err
        except urllib.error.URLError as err:
            # urllib wraps failures of connect() and of sending the request.
            if isinstance(err.reason, ConnectionRefusedError | socket.gaierror):
                raise ToolTransient(f"{where}: {err.reason}", key=key) from err
            raise ToolOutcomeUnknown(f"{where}: {err.reason}", key=key) from err
        except (OSError, http.client.HTTPException) as err:
            # Timeout, reset, RemoteDisconnected, IncompleteRead: the request was sent, so
            # the provider may have acted on it.
            raise ToolOutcomeUnknown(f"{where}: {type(err).__name__}: {err}", key=key) from err
        try:
            reply = json.loads(raw)
        except ValueError as err:
            raise ToolOutcomeUnknown(f"{where}: reply is not JSON", key=key) from err
        if not isinstance(reply, dict):
            raise ToolOutcomeUnknown(f"{where}: reply is not a JSON object", key=key)
        return status, reply


def _http_error(err: urllib.error.HTTPError, where: str, key: str | None) -> ToolError:
    """Map an HTTP error status onto the tool error a retry policy understands."""
    status = err.code
    try:
        reply = json.loads(err.read() or b"{}")
    except (OSError, ValueError, http.client.HTTPException):
        reply = {}
    if not isinstance(reply, dict):
        reply = {}
    message = f"{where} -> {status}: {reply.get('message') or reply.get('error') or err.reason}"
    details: Json = {"status": status, "key": key, "provider_error": reply.get("error")}
    if status == 403:
        return ToolPermissionDenied(message, **details)
    if status == 409:
        return ToolConflict(message, **details)
    if status == 429:
        return ToolRateLimited(message, retry_after=retry_after_seconds(err.headers), **details)
    if status in _TRANSIENT_STATUSES:
        return ToolTransient(message, **details)
    if 400 <= status < 500:
        return ToolInvalidArgument(message, **details)
    # Any other status is not one the provider promises to send before committing.
    return ToolOutcomeUnknown(message, **details)
