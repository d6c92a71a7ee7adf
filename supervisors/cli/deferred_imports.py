"""aiohttp, imported at its first use rather than at nats-py's import, in the ``ratchet``
command's process.

nats-py's client imports aiohttp when it is imported (``nats/aio/transport.py``), for its
WebSocket transport only (``ws://`` URLs, which Ratchet does not use): about 80 ms of
every ``ratchet serve`` start here, 10 % of a restart (docs/operations.md, "Restart
(W4)"). The node's own users of aiohttp (the metrics port, the web console) import it when
they start, after the node resumed its tasks.

How: importing this module, first thing in ``supervisors/cli/__init__.py`` (before
anything imports nats), defers aiohttp: a :class:`Deferred` stands in ``sys.modules`` for
aiohttp. ``import aiohttp`` binds it without loading anything; the first attribute read
from it (``aiohttp.ClientSession``, ``from aiohttp import web``, ``import aiohttp.web``)
imports the real package, which replaces it in ``sys.modules``, and every read is then
answered by the real module — behaviour is unchanged, only the moment of the import moves.
(``importlib.util.LazyLoader`` would be the standard library's way, but on Python 3.11 an
``import`` statement of an already lazy module reads its ``__spec__``, which loads it.)

Only the ``ratchet`` command does this, not ``import ratchet`` in a user's process; nothing is done when aiohttp is imported already
or not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

__all__ = ["Deferred", "defer"]


class Deferred(types.ModuleType):
    """Stands for a module not imported yet; its first attribute read imports it."""

    def __init__(self, spec: importlib.machinery.ModuleSpec) -> None:
        super().__init__(spec.name)
        self.__spec__ = spec  # what `import` reads of a module already in sys.modules
        self._lock = threading.Lock()

    def __getattr__(self, attr: str) -> Any:  # only for what this object does not have
        with self._lock:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
        return getattr(real, attr)


def defer(name: str) -> None:
    """Put a :class:`Deferred` in ``sys.modules`` for ``name`` (see the module's doc)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is not None:
        sys.modules[name] = Deferred(spec)


defer("aiohttp")
