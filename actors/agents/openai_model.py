"""A :class:`~actors.agents.models.Model` for OpenAI-compatible chat-completions endpoints.

Standard library only: one blocking ``urllib`` POST per call, run on a worker thread with
:func:`asyncio.to_thread`. Failures become the runtime's tool errors, so model calls share
the tools' retry policy. A model call has no side effect, so everything that may have
failed "in the middle" is plain :class:`~protocol.errors.ToolTransient`:

==========================================  =================================================
HTTP 429                                    :class:`~protocol.errors.ToolRateLimited`
                                            (``retry_after`` from Retry-After, default 1.0)
HTTP 5xx, 408, connection refused/reset,    :class:`~protocol.errors.ToolTransient`
timeout, malformed 200 reply
HTTP 401, 403                               :class:`~protocol.errors.ToolPermissionDenied`
HTTP 400, 404, 422 (and other statuses)     :class:`~protocol.errors.ToolInvalidArgument`
==========================================  =================================================

The API key is sent as ``Authorization: Bearer ...`` and nowhere else: it is not in
``repr()``, and it is redacted from every error message (servers do echo keys back).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ratchet.actors.agents.models import (
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)
from ratchet.protocol.errors import (
    ToolError,
    ToolInvalidArgument,
    ToolPermissionDenied,
    ToolRateLimited,
    ToolTransient,
)
from ratchet.protocol.retry_after import retry_after_seconds

__all__ = ["OpenAICompatibleModel"]

Json = dict[str, Any]

_RESERVED = frozenset({"model", "messages", "tools"})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_MAX_SERVER_MESSAGE = 300


class OpenAICompatibleModel:
    """Chat completions over HTTP (OpenAI, vLLM, Ollama, llama.cpp server, ...).

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1``; ``/chat/completions``
            is appended.
        model: the model to ask for; also :attr:`name`.
        api_key: sent as a bearer token when given.
        timeout: seconds for connecting and for each socket read.
        params: extra body fields for every call (temperature, max_tokens, ...); a
            request's own ``params`` override them.
        prices: (cost per 1k prompt tokens, cost per 1k completion tokens); without it
            every response costs 0.0.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        params: dict[str, Any] | None = None,
        prices: tuple[float, float] | None = None,
    ) -> None:
        _check_params(params or {}, ValueError)
        if urlsplit(base_url).scheme not in ("http", "https"):
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.version = model  # until a server reports the concrete model it ran
        self.timeout = timeout
        self.params: dict[str, Any] = dict(params or {})
        self.prices = prices
        self._api_key = api_key or None
        # A real endpoint may need the environment's HTTP(S)_PROXY; loopback never does.
        if urlsplit(self.base_url).hostname in _LOOPBACK:
            self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        else:
            self._opener = urllib.request.build_opener()

    def __repr__(self) -> str:
        key = "'***'" if self._api_key else "None"
        return (f"OpenAICompatibleModel(base_url={self.base_url!r}, model={self.name!r}, "
                f"api_key={key}, timeout={self.timeout!r})")

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send the conversation (and tools); return the assistant's reply.

        Raises a :class:`~protocol.errors.ToolError` subclass as tabled in the module doc.
        Cancelling the awaiting task does not stop the worker thread; it ends by itself
        within ``timeout``.
        """
        _check_params(request.params, ToolInvalidArgument)
        body: Json = {
            "model": self.name,
            "messages": [_message_out(m) for m in request.messages],
        }
        if request.tools:
            body["tools"] = [_tool_out(t) for t in request.tools]
        body.update(self.params)
        body.update(request.params)
        raw = await asyncio.to_thread(self._post, json.dumps(body).encode())
        response = self._parse(raw)
        if response.model:
            self.version = response.model
        return response

    # -- HTTP ------------------------------------------------------------------------------

    def _post(self, data: bytes) -> bytes:
        """One blocking POST; the 2xx body, or a ToolError."""
        request = urllib.request.Request(
            self.base_url + "/chat/completions", data=data, method="POST"
        )
        request.add_header("Content-Type", "application/json")
        request.add_header("Accept", "application/json")
        if self._api_key is not None:
            request.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as err:
            raise self._http_error(err) from None
        except urllib.error.URLError as err:
            # connect() failed (refused, unresolvable, timed out) or the send did.
            raise self._error(
                ToolTransient, f"cannot reach the model server: {err.reason}"
            ) from err
        except TimeoutError as err:
            raise self._error(
                ToolTransient, f"the model server did not answer within {self.timeout:g} s"
            ) from err
        except (OSError, http.client.HTTPException) as err:
            # Timeout, reset, RemoteDisconnected, IncompleteRead: nothing happened that a
            # retry could duplicate, so all of them are transient.
            raise self._error(
                ToolTransient, f"model call failed: {type(err).__name__}: {err}"
            ) from err

    def _http_error(self, err: urllib.error.HTTPError) -> ToolError:
        """Map an error status onto the tool error a retry policy understands."""
        status = err.code
        try:
            raw = err.read()
        except (OSError, http.client.HTTPException):
            raw = b""
        finally:
            err.close()
        text = f"model server answered {status}: {_server_message(raw) or err.reason}"
        if status == 429:
            retry_after = retry_after_seconds(err.headers)
            return self._error(ToolRateLimited, text, status=status, retry_after=retry_after)
        if status >= 500 or status == 408:
            return self._error(ToolTransient, text, status=status)
        if status in (401, 403):
            return self._error(ToolPermissionDenied, text, status=status)
        return self._error(ToolInvalidArgument, text, status=status)

    def _error(self, kind: type[ToolError], message: str, **details: Any) -> ToolError:
        """Build an error whose message cannot carry the API key."""
        if self._api_key:
            message = message.replace(self._api_key, "***")
        return kind(message, model=self.name, **details)

    # -- decoding --------------------------------------------------------------------------

    def _parse(self, raw: bytes) -> ModelResponse:
        """Decode a 200 body; anything unexpected is ToolTransient("malformed response")."""
        try:
            return _response_in(raw, self.prices)
        except _Malformed as err:
            raise self._error(ToolTransient, f"malformed response: {err}") from None


class _Malformed(Exception):
    """A 200 reply that does not have the chat-completion shape.

    Private, not in ``protocol/errors.py``: ``_parse`` always turns it into ToolTransient."""


def _check_params(params: Mapping[str, Any], kind: type[Exception]) -> None:
    clash = sorted(_RESERVED & params.keys())
    if clash:
        raise kind(f"params may not set {', '.join(clash)}: the adapter owns those fields")


def _message_out(message: Message) -> Json:
    """A :class:`Message` in OpenAI's wire format."""
    if message.role == "tool":
        if message.tool_call_id is None:
            raise ToolInvalidArgument("a tool message needs the tool_call_id it answers")
        # OpenAI wants a string here; the name is not part of a tool message.
        return {"role": "tool", "tool_call_id": message.tool_call_id,
                "content": message.content or ""}
    out: Json = {"role": message.role, "content": message.content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            for call in message.tool_calls
        ]
    return out


def _tool_out(tool: ToolSpec) -> Json:
    return {"type": "function", "function": {
        "name": tool.name, "description": tool.description, "parameters": tool.parameters}}


def _response_in(raw: bytes, prices: tuple[float, float] | None) -> ModelResponse:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _Malformed(f"body is not JSON: {_snippet(raw)!r}") from None
    if not isinstance(body, dict):
        raise _Malformed("body is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Malformed("no choices[0]")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _Malformed("no choices[0].message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _Malformed("message content is neither a string nor null")
    calls = tuple(_call_in(c) for c in message.get("tool_calls") or ())
    usage = _usage_in(body.get("usage"))
    cost = 0.0
    if prices is not None:
        cost = (usage.prompt_tokens * prices[0] + usage.completion_tokens * prices[1]) / 1000
    model, response_id = body.get("model"), body.get("id")
    return ModelResponse(
        message=Message(role="assistant", content=content, tool_calls=calls),
        usage=usage,
        model=model if isinstance(model, str) else "",
        response_id=response_id if isinstance(response_id, str) else None,
        cost=cost,
    )


def _call_in(raw: Any) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict):
        raise _Malformed("a tool call has no function")
    call_id, name, arguments = raw.get("id"), function.get("name"), function.get("arguments")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise _Malformed("a tool call lacks its id or function name")
    if isinstance(arguments, str):
        # Some servers send "" for a call without arguments.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise _Malformed(f"arguments of {name!r} are not JSON: {arguments[:80]!r}") from None
    elif arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise _Malformed(f"arguments of {name!r} are not a JSON object")
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _usage_in(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()

    def count(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return Usage(prompt_tokens=count("prompt_tokens"), completion_tokens=count("completion_tokens"))


def _server_message(raw: bytes) -> str:
    """The error text of an error body (OpenAI's ``{"error": {"message"}}`` or looser)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return _snippet(raw)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    if not isinstance(error, str) and isinstance(body, dict):
        error = body.get("message")
    return _snippet(error.encode()) if isinstance(error, str) else _snippet(raw)


def _snippet(raw: bytes) -> str:
    text = raw.decode(errors="replace").strip()
    return text if len(text) <= _MAX_SERVER_MESSAGE else text[:_MAX_SERVER_MESSAGE] + "..."
