"""An OpenAI-compatible chat-completions server on loopback: scripted replies, injected faults.

Run it as its own process: ``python -m ratchet.testing.model_stub [--host H] [--port 0]`` prints
one JSON line ``{"url": "http://H:PORT/v1", "pid": N}`` once listening, then serves until
SIGTERM/SIGINT.

``POST /v1/chat/completions`` answers with the next scripted reply, or ``{"content": "done"}``
when none is left. A reply is ``{"content": "text"}`` or ``{"tool_calls": [{"name": n,
"arguments": {...}}]}`` (both may be given), optionally with ``"usage": {"prompt_tokens": n,
"completion_tokens": m}`` (default 10/5) and ``"model"`` (the version to report; default the
requested model + ``"-stub"``). The stub assigns call ids and JSON-encodes arguments as
OpenAI does; arguments given as a string are sent verbatim (to script malformed ones).

Test controls: ``POST /_script {"replies": [...]}`` appends replies; ``POST /_faults
{"rules": [...]}`` appends fault rules; ``GET /_requests`` -> ``{"requests": [{"authorized":
bool, "body": {...}}, ...]}`` (every chat request received, faulted or not); ``POST /_reset``;
``GET /_health``. A rule is ``{"mode": MODE, "times": 1, "retry_after": 1.0, "delay": 0.0}``,
MODE one of :data:`MODES`; rules are consumed in order, and a faulted request does not
consume a scripted reply (``slow`` sleeps, then answers with the next reply left in place).
``status_401`` echoes the presented key in its message, as careless providers do, so that
clients can prove they redact it.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

from ratchet.testing.http_server import JsonHandler, SimulatorServer, serve_main

__all__ = [
    "MODES", "FaultRule", "ModelStubServer", "Reject", "StubState", "check_reply", "completion",
    "main",
]

MODES = frozenset(
    "status_429 status_500 status_400 status_401 malformed_json no_choices slow".split()
)
_STATUS = {"status_429": 429, "status_500": 500, "status_400": 400, "status_401": 401}
_MAX_BODY = 1 << 22
_MAX_DELAY = 60.0

Json = dict[str, Any]


class Reject(Exception):
    """A request refused with an HTTP status and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


@dataclass
class FaultRule:
    """One injected fault; each matching chat request consumes one of its ``times``."""

    mode: str
    times: int = 1
    retry_after: float = 1.0
    delay: float = 0.0

    @classmethod
    def parse(cls, raw: Any) -> FaultRule:
        """Validate a rule as sent to ``POST /_faults``; raises :class:`Reject` (400)."""
        if not isinstance(raw, dict) or raw.get("mode") not in MODES:
            raise Reject(400, f"a rule is an object whose mode is one of {sorted(MODES)}")
        times = raw.get("times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise Reject(400, "rule times must be an integer >= 1")
        numbers = [raw.get("retry_after", 1.0), raw.get("delay", 0.0)]
        if any(isinstance(n, bool) or not isinstance(n, int | float) or n < 0 for n in numbers):
            raise Reject(400, "rule retry_after and delay must be numbers >= 0")
        return cls(raw["mode"], times, float(numbers[0]), min(float(numbers[1]), _MAX_DELAY))


def check_reply(raw: Any) -> Json:
    """Validate a scripted reply as sent to ``POST /_script``; raises :class:`Reject` (400)."""
    if not isinstance(raw, dict) or not ({"content", "tool_calls"} & raw.keys()):
        raise Reject(400, "a reply is an object with content and/or tool_calls")
    if not isinstance(raw.get("content", ""), str):
        raise Reject(400, "reply content must be a string")
    calls = raw.get("tool_calls", [])
    if not isinstance(calls, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str)
        and isinstance(c.get("arguments", {}), dict | str) for c in calls
    ):
        raise Reject(400, "reply tool_calls must be [{'name': str, 'arguments': {...}}, ...]")
    usage = raw.get("usage", {})
    if not isinstance(usage, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in usage.values()
    ):
        raise Reject(400, "reply usage must map token counts to integers")
    if not isinstance(raw.get("model", ""), str):
        raise Reject(400, "reply model must be a string")
    return copy.deepcopy(raw)


@dataclass
class StubState:
    """Script, faults and request log, in memory; every method takes the lock."""

    replies: deque[Json] = field(default_factory=deque)
    faults: list[FaultRule] = field(default_factory=list)
    requests: list[Json] = field(default_factory=list)
    serial: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, authorized: bool, body: Json) -> None:
        with self.lock:
            self.requests.append({"authorized": authorized, "body": copy.deepcopy(body)})

    def take_fault(self) -> FaultRule | None:
        """Consume one use of the first rule, if any."""
        with self.lock:
            if not self.faults:
                return None
            rule = self.faults[0]
            rule.times -= 1
            if rule.times <= 0:
                del self.faults[0]
            return copy.copy(rule)

    def next_reply(self, *, consume: bool = True) -> tuple[int, Json]:
        """A fresh serial number (for ids) and the next reply (``done`` when none is left)."""
        with self.lock:
            self.serial += 1
            if not self.replies:
                return self.serial, {"content": "done"}
            reply = self.replies.popleft() if consume else self.replies[0]
            return self.serial, copy.deepcopy(reply)

    def add(self, replies: list[Json] | None = None, rules: list[FaultRule] | None = None) -> None:
        with self.lock:
            self.replies.extend(replies or [])
            self.faults.extend(rules or [])

    def log(self) -> list[Json]:
        with self.lock:
            return copy.deepcopy(self.requests)

    def reset(self) -> None:
        with self.lock:
            self.replies, self.faults, self.requests, self.serial = deque(), [], [], 0


def completion(reply: Json, requested_model: str, serial: int) -> Json:
    """A chat-completion body, shaped as OpenAI's, for one scripted reply."""
    calls = [
        {"id": f"call_{serial:06d}_{index}", "type": "function",
         "function": {"name": call["name"], "arguments": _encoded(call.get("arguments", {}))}}
        for index, call in enumerate(reply.get("tool_calls", []))
    ]
    message: Json = {"role": "assistant", "content": reply.get("content")}
    if calls:
        message["tool_calls"] = calls
    usage = {"prompt_tokens": 10, "completion_tokens": 5, **reply.get("usage", {})}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {
        "id": f"chatcmpl-stub-{serial:06d}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.get("model") or f"{requested_model}-stub",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": usage,
    }


def _encoded(arguments: Json | str) -> str:
    # OpenAI sends arguments as a JSON *string*; a scripted string goes out untouched.
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class ModelStubServer(SimulatorServer):
    """The HTTP server; ``state`` is shared by all handler threads."""

    def __init__(self, address: tuple[str, int], *, verbose: bool = False) -> None:
        self.state = StubState()
        super().__init__(address, _Handler, verbose=verbose)


class _Handler(JsonHandler):
    server_version = "RatchetModelStub/1.0"

    @property
    def state(self) -> StubState:
        return cast(ModelStubServer, self.server).state

    def do_GET(self) -> None:
        try:
            self._route(self.command, urlsplit(self.path).path)
        except Reject as err:
            kind = "server_error" if err.status >= 500 else "invalid_request_error"
            error = {"message": err.message, "type": kind, "param": None, "code": None}
            self._reply(err.status, {"error": error}, err.headers)
        except Exception as err:  # never let one bad request take the server down
            self._reply(500, {"error": {"message": repr(err), "type": "server_error"}})

    do_POST = do_GET

    def _route(self, method: str, path: str) -> None:
        state = self.state
        if method == "POST" and path == "/v1/chat/completions":
            self._chat()
        elif method == "POST" and path == "/_script":
            state.add(replies=[check_reply(raw) for raw in self._listed("replies")])
            self._reply(200, {"ok": True})
        elif method == "POST" and path == "/_faults":
            state.add(rules=[FaultRule.parse(raw) for raw in self._listed("rules")])
            self._reply(200, {"ok": True})
        elif method == "GET" and path == "/_requests":
            self._reply(200, {"requests": state.log()})
        elif method == "POST" and path == "/_reset":
            state.reset()
            self._reply(200, {"ok": True})
        elif method == "GET" and path == "/_health":
            self._reply(200, {"ok": True})
        else:
            raise Reject(404, f"no route for {method} {path}")

    def _chat(self) -> None:
        body = self._body()
        authorization = self.headers.get("Authorization", "")
        token = authorization[len("Bearer "):] if authorization.startswith("Bearer ") else ""
        self.state.record(bool(token), body)
        rule = self.state.take_fault()
        mode = rule.mode if rule is not None else None
        if rule is not None and mode in _STATUS:
            headers = {"Retry-After": f"{rule.retry_after:g}"} if mode == "status_429" else None
            text = f"Incorrect API key provided: {token}" if mode == "status_401" else None
            raise Reject(_STATUS[rule.mode], text or f"injected {mode}", headers)
        if mode == "malformed_json":
            self._reply(200, b'{"id": "chatcmpl-broken", "choices": [{"message": ')
            return
        if mode == "no_choices":
            self._reply(200, {"id": "chatcmpl-empty", "object": "chat.completion", "choices": []})
            return
        if rule is not None and mode == "slow":
            time.sleep(rule.delay)
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str) or not isinstance(messages, list) or not messages:
            raise Reject(400, "'model' (string) and 'messages' (non-empty list) are required")
        serial, reply = self.state.next_reply(consume=mode is None)
        self._reply(200, completion(reply, model, serial))

    # -- I/O -------------------------------------------------------------------------------

    def _body(self) -> Json:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise Reject(400, "bad Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            raise Reject(400, "body too large or negative length")
        try:
            body = json.loads(self.rfile.read(length) if length else b"{}")
        except (ValueError, UnicodeDecodeError):
            raise Reject(400, "body is not valid JSON") from None
        if not isinstance(body, dict):
            raise Reject(400, "body must be a JSON object")
        return body

    def _listed(self, name: str) -> list[Any]:
        items = self._body().get(name)
        if not isinstance(items, list):
            raise Reject(400, f"body must be {{{name!r}: [...]}}")
        return items


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; announce ``{"url", "pid"}`` on stdout once listening."""
    return serve_main(argv, prog="python -m ratchet.testing.model_stub", description=__doc__,
                      make_server=lambda address, verbose: ModelStubServer(address,
                                                                           verbose=verbose),
                      url_path="/v1", formatter_class=argparse.RawDescriptionHelpFormatter)


if __name__ == "__main__":
    sys.exit(main())
