"""A finance provider (claims and refunds) simulated over HTTP on loopback, with fault injection.

Run it as its own process: ``python -m ratchet.testing.finance [--host H] [--port 0]`` prints one
JSON line ``{"url": ..., "pid": ...}`` once listening, then serves until SIGTERM/SIGINT.

Provider: ``POST /claims`` and ``POST /refunds`` (body ``{"idempotency_key": k, ...}``, key
also in the Idempotency-Key header, which wins) answer 201 new, 200 replay (202 while
pending), 409 key reused for another body, 400 bad input, 403 on ``X-Permission: deny``;
``GET /actions/<key>`` answers 200 ``{"found": true, "result": ...}`` or 404.

Test controls: ``POST /_faults {"rules": [...]}`` appends rules, ``DELETE /_faults`` clears,
``GET /_faults`` lists them; ``POST /_confirm/<key>`` completes a pending action;
``GET /_effects`` -> ``{"effects": {key: n}, "actions": {key: result}}``; ``POST /_reset``;
``GET /_health``. A rule is ``{"op": "claims"|"refunds"|"query"|"*", "mode": MODE,
"times": 1, "key": None, "retry_after": 1.0, "delay": 0.0}``, MODE one of :data:`MODES`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from ratchet.testing.http_server import JsonHandler, SimulatorServer, serve_main

__all__ = ["MODES", "OPS", "FaultRule", "FinanceServer", "FinanceState", "Reject", "main"]

OPS = frozenset({"claims", "refunds", "query", "*"})
MODES = frozenset(
    "drop_after_commit drop_before_commit status_429 status_500 status_503 slow accept".split()
)
_PREFIX = {"claims": "clm", "refunds": "rfd"}
_MAX_BODY = 1 << 20
_MAX_DELAY = 60.0

Json = dict[str, Any]


class Reject(Exception):
    """A request refused with an HTTP status and a JSON error body."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


def request_hash(fields: Json) -> str:
    """sha256 of the canonical JSON of a request body without its idempotency key."""
    body = {k: v for k, v in fields.items() if k != "idempotency_key"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class FaultRule:
    """One injected fault; consumed one use per matching request."""

    op: str
    mode: str
    times: int = 1
    key: str | None = None
    retry_after: float = 1.0
    delay: float = 0.0

    @classmethod
    def parse(cls, raw: Any) -> FaultRule:
        """Validate a rule as sent to ``POST /_faults``; raises :class:`Reject` (400)."""
        if not isinstance(raw, dict):
            raise Reject(400, "invalid_argument", "a fault rule must be an object")
        op, mode = raw.get("op", "*"), raw.get("mode")
        if op not in OPS:
            raise Reject(400, "invalid_argument", f"rule op must be one of {sorted(OPS)}")
        if mode not in MODES:
            raise Reject(400, "invalid_argument", f"rule mode must be one of {sorted(MODES)}")
        times = raw.get("times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise Reject(400, "invalid_argument", "rule times must be an integer >= 1")
        key = raw.get("key")
        if key is not None and not isinstance(key, str):
            raise Reject(400, "invalid_argument", "rule key must be a string")
        retry_after = _seconds(raw.get("retry_after", 1.0), "retry_after")
        delay = min(_seconds(raw.get("delay", 0.0), "delay"), _MAX_DELAY)
        return cls(op, mode, times, key, retry_after, delay)

    def matches(self, op: str, key: str) -> bool:
        return self.op in ("*", op) and (self.key is None or self.key == key)


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise Reject(400, "invalid_argument", f"rule {name} must be a number >= 0")
    return float(value)


@dataclass
class _Action:
    op: str
    request_hash: str
    body: Json
    result: Json


@dataclass
class FinanceState:
    """All provider state, in memory; every method takes the lock (handlers are threads)."""

    actions: dict[str, _Action] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    faults: list[FaultRule] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    #: Requests received per provider operation (claims, refunds, query), effect or not.
    requests: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, op: str, key: str, body: Json, *, pending: bool = False) -> tuple[int, Json]:
        """Commit an action once per key; a replay returns the stored result unchanged."""
        digest = request_hash(body)
        with self.lock:
            known = self.actions.get(key)
            if known is not None:
                if known.op != op or known.request_hash != digest:
                    raise Reject(409, "conflict", f"key {key!r} was used for another request")
                status = 202 if known.result["status"] == "pending" else 200
                return status, copy.deepcopy(known.result)
            number = self.counters.get(op, 0) + 1
            self.counters[op] = number
            result: Json = {
                "provider_id": f"{_PREFIX[op]}_{number:06d}",
                "status": "pending" if pending else "completed",
                "idempotency_key": key,
                "operation": op,
            }
            # Echo the business fields, but never let them overwrite the provider's own.
            for name, value in body.items():
                if name != "idempotency_key":
                    result.setdefault(name, copy.deepcopy(value))
            self.actions[key] = _Action(op, digest, copy.deepcopy(body), result)
            self.effects[key] = self.effects.get(key, 0) + 1
            return (202 if pending else 201), copy.deepcopy(result)

    def query(self, key: str) -> Json | None:
        with self.lock:
            known = self.actions.get(key)
            return None if known is None else copy.deepcopy(known.result)

    def confirm(self, key: str) -> Json | None:
        """Complete a pending action (a no-op on a completed one); None if unknown."""
        with self.lock:
            known = self.actions.get(key)
            if known is None:
                return None
            known.result["status"] = "completed"
            return copy.deepcopy(known.result)

    def take_fault(self, op: str, key: str) -> FaultRule | None:
        """Consume one use of the first rule matching (op, key), if any."""
        with self.lock:
            for index, rule in enumerate(self.faults):
                if rule.matches(op, key):
                    rule.times -= 1
                    if rule.times <= 0:
                        del self.faults[index]
                    return copy.copy(rule)
            return None

    def add_faults(self, rules: list[FaultRule]) -> int:
        with self.lock:
            self.faults.extend(rules)
            return len(self.faults)

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def list_faults(self) -> list[Json]:
        with self.lock:
            return [asdict(rule) for rule in self.faults]

    def count_request(self, op: str) -> None:
        with self.lock:
            self.requests[op] = self.requests.get(op, 0) + 1

    def snapshot(self) -> Json:
        with self.lock:
            return {
                "effects": dict(self.effects),
                "requests": dict(self.requests),
                "actions": {k: copy.deepcopy(a.result) for k, a in self.actions.items()},
            }

    def reset(self) -> None:
        with self.lock:
            self.actions.clear()
            self.effects.clear()
            self.faults.clear()
            self.counters.clear()
            self.requests.clear()


class FinanceServer(SimulatorServer):
    """The HTTP server; ``state`` is shared by all handler threads."""

    def __init__(self, address: tuple[str, int], *, verbose: bool = False) -> None:
        self.state = FinanceState()
        super().__init__(address, _Handler, verbose=verbose)


class _Handler(JsonHandler):
    server_version = "RatchetFinanceSim/1.0"

    @property
    def state(self) -> FinanceState:
        return cast(FinanceServer, self.server).state

    def do_GET(self) -> None:
        self._dispatch(self.command)

    do_POST = do_DELETE = do_GET

    # -- routing ---------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path
        try:
            self._route(method, path)
        except _Dropped:
            return
        except _Status as err:
            retry = {"Retry-After": f"{err.rule.retry_after:g}"} if err.status == 429 else None
            self._reply(err.status, {"error": err.error, "message": err.message}, retry)
        except Reject as err:
            self._reply(err.status, {"error": err.error, "message": err.message})
        except Exception as err:  # never let one bad request take the server down
            self._reply(500, {"error": "internal", "message": repr(err)})

    def _route(self, method: str, path: str) -> None:
        state = self.state
        if method == "POST" and path in ("/claims", "/refunds"):
            state.count_request(path[1:])
            self._write(path[1:])
        elif method == "GET" and path.startswith("/actions/"):
            state.count_request("query")
            self._query(unquote(path[len("/actions/") :]))
        elif method == "GET" and path == "/_health":
            self._reply(200, {"ok": True})
        elif method == "GET" and path == "/_effects":
            self._reply(200, state.snapshot())
        elif path == "/_faults" and method == "GET":
            self._reply(200, {"rules": state.list_faults()})
        elif path == "/_faults" and method == "POST":
            rules = self._body().get("rules")
            if not isinstance(rules, list):
                raise Reject(400, "invalid_argument", "body must be {'rules': [rule, ...]}")
            count = state.add_faults([FaultRule.parse(raw) for raw in rules])
            self._reply(200, {"ok": True, "rules": count})
        elif path == "/_faults" and method == "DELETE":
            state.clear_faults()
            self._reply(200, {"ok": True})
        elif method == "POST" and path == "/_reset":
            state.reset()
            self._reply(200, {"ok": True})
        elif method == "POST" and path.startswith("/_confirm/"):
            result = state.confirm(unquote(path[len("/_confirm/") :]))
            if result is None:
                raise Reject(404, "not_found", "no action with this idempotency key")
            self._reply(200, result)
        else:
            raise Reject(404, "not_found", f"no route for {method} {path}")

    # -- provider operations ---------------------------------------------------------------

    def _write(self, op: str) -> None:
        body = self._body()
        key = self.headers.get("Idempotency-Key") or body.get("idempotency_key")
        if not isinstance(key, str) or not key:
            raise Reject(400, "invalid_argument", "an idempotency key is required")
        amount = body.get("amount")
        if amount is not None and (
            isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0
        ):
            raise Reject(400, "invalid_argument", "amount must be a number >= 0")
        if self.headers.get("X-Permission", "").strip().lower() == "deny":
            raise Reject(403, "permission_denied", "the caller may not perform this action")
        rule = self._pre_fault(op, key)
        pending = rule is not None and rule.mode == "accept"
        status, result = self.state.submit(op, key, body, pending=pending)
        if rule is not None and rule.mode == "drop_after_commit":
            self._drop()
            return
        self._reply(status, result)

    def _query(self, key: str) -> None:
        rule = self._pre_fault("query", key)
        result = self.state.query(key)
        if rule is not None and rule.mode == "drop_after_commit":
            self._drop()
        elif result is None:
            self._reply(404, {"found": False})
        else:
            self._reply(200, {"found": True, "result": result})

    def _pre_fault(self, op: str, key: str) -> FaultRule | None:
        """Apply the faults that act before processing; return the rule still to apply."""
        rule = self.state.take_fault(op, key)
        if rule is None:
            return None
        if rule.mode == "drop_before_commit":
            self._drop()
            raise _Dropped
        if rule.mode == "status_429":
            raise _Status(429, rule)
        if rule.mode in ("status_500", "status_503"):
            raise _Status(int(rule.mode[-3:]), rule)
        if rule.mode == "slow":
            time.sleep(rule.delay)
        return rule

    # -- I/O -------------------------------------------------------------------------------

    def _body(self) -> Json:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise Reject(400, "invalid_argument", "bad Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            raise Reject(400, "invalid_argument", "body too large or negative length")
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise Reject(400, "invalid_argument", "body is not valid JSON") from None
        if not isinstance(body, dict):
            raise Reject(400, "invalid_argument", "body must be a JSON object")
        return body

    def _drop(self) -> None:
        """Close the connection abruptly: linger 0 makes the close send RST, no response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # The fd really closes when the handler's rfile lets go of it in finish().
            self.connection.close()


class _Dropped(Exception):
    """Unwinds a handler whose connection was dropped on purpose."""


class _Status(Reject):
    """An injected error status; nothing was committed."""

    def __init__(self, status: int, rule: FaultRule) -> None:
        super().__init__(status, "injected_fault", f"injected {rule.mode}")
        self.rule = rule


# -- process entry point -------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; announce ``{"url", "pid"}`` on stdout once listening."""
    return serve_main(argv, prog="python -m ratchet.testing.finance", description=__doc__,
                      make_server=lambda address, verbose: FinanceServer(address,
                                                                         verbose=verbose))


if __name__ == "__main__":
    sys.exit(main())
