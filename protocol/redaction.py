"""Redaction: what a secret looks like wherever it is shown rather than stored.

A secret is a pydantic ``SecretStr`` (or ``SecretBytes``) — a field so typed in a tool's
argument or result model, or in a workflow's ``input_model`` — and its clear value is
known only to the code that runs with it (step, tool) and to the sealed copy at rest
(protocol/secrets.py). Everywhere else it is :data:`REDACTED`:

- events, handoff packages, a task's output and error, approval requests and replies are
  packed with :func:`redacting` as msgpack's ``default`` (a secret object left in them
  becomes ``"**redacted**"``; nothing to pay when there is none);
- text that may quote a clear value (an exception's message, a traceback) is scrubbed of
  the clear values its task is known to hold (:func:`redact` with ``secrets``);
- log lines go through :func:`redact_log_event`, a structlog processor that does both,
  with the clear values of the tasks that are live in this process (:data:`LIVE`).

Also here: the model helpers the runtime dumps and loads secret-bearing models with.
"""

from __future__ import annotations

import threading
import types
import typing
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import msgpack
from pydantic import BaseModel, SecretBytes, SecretStr

from ratchet.protocol.secrets import SEALED_CODES

__all__ = ["LIVE", "LiveSecrets", "REDACTED", "dump_model", "has_secrets", "pack_redacted",
           "redact", "redact_log_event", "redacting", "reveal", "secret_values"]

#: What a secret looks like where it is shown.
REDACTED = "**redacted**"
#: Clear values shorter than this are not searched for in text (a 2-letter "secret" would
#: blank out every word holding it); the secret objects themselves are always redacted.
MIN_SCRUB_LENGTH = 4

_SECRET_TYPES = (SecretStr, SecretBytes)


def _is_secret(value: Any) -> bool:
    return isinstance(value, _SECRET_TYPES) or (
        isinstance(value, msgpack.ExtType) and value.code in SEALED_CODES)


def redacting(obj: Any) -> str:
    """msgpack's ``default`` for shown values: a secret object becomes :data:`REDACTED`."""
    if isinstance(obj, _SECRET_TYPES):
        return REDACTED
    raise TypeError(f"can not serialize {type(obj).__name__!r} object")


def pack_redacted(value: Any) -> bytes:
    """msgpack bytes of a value that is shown, not stored: its secrets redacted."""
    try:
        # Plain data first: a ``default`` hook costs ~0.1 µs per call even when it is never
        # called, and events are packed at every step; only a secret gets the second pass.
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
    except TypeError:
        return msgpack.packb(value, use_bin_type=True, default=redacting)  # type: ignore[no-any-return]


def scrub_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if len(secret) >= MIN_SCRUB_LENGTH and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A copy of ``value`` to show: secret objects (and sealed leaves) become
    :data:`REDACTED`, and ``secrets`` (clear values) are cut out of every string."""
    known = tuple(secrets)
    return _redact(value, known)


def _redact(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return scrub_text(value, secrets) if secrets else value
    if _is_secret(value):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: _redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(v, secrets) for v in value]
    return value


def secret_values(value: Any) -> set[str]:
    """The clear values of the ``SecretStr`` objects in ``value`` (maps and lists walked)."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, SecretStr):
            found.add(item.get_secret_value())
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


def reveal(value: Any) -> Any:
    """``value`` with every secret object replaced by its clear value: what a client sends
    to the node (a model is dumped first). Only for the wire to the node, never for a log."""
    if isinstance(value, BaseModel):
        return reveal(dump_model(value))
    if isinstance(value, _SECRET_TYPES):
        return value.get_secret_value()
    if isinstance(value, Mapping):
        return {k: reveal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [reveal(v) for v in value]
    return value


# -- models ----------------------------------------------------------------------------

_HAS_SECRETS: dict[type[BaseModel], bool] = {}


def has_secrets(model: type[BaseModel]) -> bool:
    """Whether a model class declares a secret field, at any depth (nested models,
    ``Optional``, lists, maps, ``Annotated``); cached per class."""
    known = _HAS_SECRETS.get(model)
    if known is None:
        known = _HAS_SECRETS[model] = _type_has_secrets(model, set())
    return known


def _type_has_secrets(tp: Any, seen: set[int]) -> bool:
    if id(tp) in seen:
        return False  # a recursive model: its other fields are being looked at
    seen.add(id(tp))
    if isinstance(tp, type) and issubclass(tp, _SECRET_TYPES):
        return True
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return any(_type_has_secrets(f.annotation, seen) for f in tp.model_fields.values())
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is not None:
        return any(_type_has_secrets(a, seen) for a in typing.get_args(tp))
    return False


def dump_model(model: BaseModel) -> Any:
    """``model.model_dump(mode="json")``, except that secret fields keep their secret
    objects (pydantic's JSON dump would mask them as ``"**********"``, losing the value):
    plain data with secret leaves, which :class:`~protocol.secrets.Sealer` seals at rest and
    :func:`redacting` redacts where shown."""
    data = model.model_dump(mode="json")
    return _overlay(model, data) if has_secrets(type(model)) else data


def _overlay(py: Any, data: Any) -> Any:
    if isinstance(py, _SECRET_TYPES):
        return py
    if isinstance(py, BaseModel) and isinstance(data, dict):
        for name in type(py).model_fields:
            if name in data:
                data[name] = _overlay(getattr(py, name), data[name])
        return data
    if isinstance(py, list | tuple) and isinstance(data, list):
        return [_overlay(p, d) for p, d in zip(py, data, strict=False)]
    if isinstance(py, dict) and isinstance(data, dict) and len(py) == len(data):
        # Keys may have been turned into strings by the JSON dump: pair them by position.
        return {k: _overlay(p, d) for p, (k, d) in zip(py.values(), data.items(), strict=True)}
    return data


# -- logs ------------------------------------------------------------------------------


class LiveSecrets:
    """The clear values of the tasks live in this process, by owner (a task id): what log
    lines are scrubbed of. A task actor adds its task's secrets when it starts and takes
    them back when it parks or ends, so the set stays as small as the running tasks'."""

    def __init__(self) -> None:
        self._by_owner: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()  # tool threads log too
        self._all: tuple[str, ...] = ()

    def add(self, owner: str, values: Iterable[str]) -> None:
        found = frozenset(v for v in values if len(v) >= MIN_SCRUB_LENGTH)
        if not found or found <= self._by_owner.get(owner, frozenset()):
            return
        with self._lock:
            self._by_owner[owner] = self._by_owner.get(owner, frozenset()) | found
            self._all = tuple(frozenset().union(*self._by_owner.values()))

    def discard(self, owner: str) -> None:
        if owner in self._by_owner:
            with self._lock:
                self._by_owner.pop(owner, None)
                self._all = tuple(frozenset().union(*self._by_owner.values()))

    def values(self) -> tuple[str, ...]:
        return self._all

    def of(self, owner: str) -> frozenset[str]:
        return self._by_owner.get(owner, frozenset())


#: The process's live secrets (one per process: structlog's processors are too).
LIVE = LiveSecrets()


def redact_log_event(logger: Any, method: str,
                     event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: secret objects in a log line become :data:`REDACTED`, and the
    clear values of live tasks are cut out of its strings. Put it just before the renderer
    (after ``format_exc_info``, if any, so that a rendered traceback is scrubbed too);
    ``ratchet serve`` does, and a node adds it to the chain it finds."""
    secrets = LIVE.values()
    for key, value in event.items():
        if isinstance(value, str):
            if secrets:
                event[key] = scrub_text(value, secrets)
        elif isinstance(value, BaseException):
            if secrets and any(s in str(value) for s in secrets):
                event[key] = scrub_text(repr(value), secrets)
        elif not isinstance(value, int | float | bool) and value is not None:
            event[key] = _redact(value, secrets)
    return event
