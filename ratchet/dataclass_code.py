"""Dataclass methods compiled once, not at every start of the ``ratchet`` command
(docs/operations.md, "Restart (W4)").

On Python 3.11 and 3.12, ``@dataclass`` writes each method it adds (``__init__``,
``__repr__``, ``__eq__``, ``__hash__``, a frozen class's ``__setattr__``...) as source text
and ``exec``\\ s it, which compiles it: about 970 texts for the ~230 dataclasses a
``ratchet serve`` start defines (the node's own, nats-py's, pydantic's), ~105 ms of its
~450 ms of imports here. A text is the same at every start, so its code object is too.
:func:`install` gives the ``dataclasses`` module a stand-in for ``exec`` that runs the
code object kept for a text, and compiles only a text it has not kept; the kept ones are
read from a file beside the package's byte code as the command starts (~5 ms).

What runs is what ran before: ``compile(text, "<string>", "exec", dont_inherit=True)`` is
what ``exec(text)`` compiles inside ``dataclasses`` (which has no ``__future__`` import),
and the code object is executed in the same globals and namespace. Texts are keyed by
their BLAKE2b digest (128 bits), in a file stamped with the interpreter's byte-code magic
number: another Python version reads none of it. A file that cannot be read is no file
(everything compiles, as before); the cache is never a reason for a command to fail.

Written (atomically: a temporary file renamed) by ``make install``
(``python -m ratchet.dataclass_code``: the texts of what a serving node imports, nothing
else), and by the command at the end of a start (:func:`release`) when that start compiled
texts the file lacked — unless byte code is not written (``PYTHONDONTWRITEBYTECODE``,
``-B``), as for ``.pyc`` files. Only the ``ratchet`` command installs it
(``ratchet/__main__.py``); ``import ratchet`` in a user's process leaves ``dataclasses``
alone. Python 3.13 compiles a class's methods in one text already; there (and on any
version whose ``dataclasses`` does not look up ``exec`` as a global) nothing is done.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import importlib
import importlib.util
import marshal
import os
import sys
import tempfile
from pathlib import Path
from types import CodeType
from typing import Any

__all__ = ["cache_file", "install", "release"]

_kept: dict[bytes, CodeType] = {}
_new: dict[bytes, CodeType] = {}
_installed = False


def cache_file() -> Path:
    """Where the kept code objects are: ``ratchet/__pycache__`` (or under
    ``sys.pycache_prefix``), named for this interpreter."""
    pyc = Path(importlib.util.cache_from_source(__file__))
    return pyc.with_name(f"dataclass-code.{sys.implementation.cache_tag}.bin")


def _exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:
    """``exec`` for ``dataclasses``: a text's kept code object, compiled once."""
    if type(source) is not str:
        return builtins.exec(source, globals, locals)
    key = hashlib.blake2b(source.encode(), digest_size=16).digest()
    code = _kept.get(key) or _new.get(key)
    if code is None:
        code = compile(source, "<string>", "exec", dont_inherit=True)
        _new[key] = code
    return builtins.exec(code, globals, locals)


def _read(path: Path) -> dict[bytes, CodeType]:
    try:
        data = path.read_bytes()
        if data[:4] != importlib.util.MAGIC_NUMBER:
            return {}
        kept = marshal.loads(data[4:])
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    return kept if isinstance(kept, dict) else {}


def _write(path: Path, codes: dict[bytes, CodeType]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            os.fchmod(fd, 0o644)  # as readable as the byte code beside it
            with os.fdopen(fd, "wb") as f:
                f.write(importlib.util.MAGIC_NUMBER + marshal.dumps(codes))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:  # a read-only install: every start compiles, as without the cache
        pass


def install() -> None:
    """Read the kept code objects and give ``dataclasses`` the stand-in ``exec`` (once;
    nothing where ``dataclasses`` does not compile through ``exec``)."""
    global _installed
    if _installed or sys.version_info >= (3, 13) or "exec" in vars(dataclasses):
        return
    _installed = True
    _kept.update(_read(cache_file()))
    dataclasses.exec = _exec  # type: ignore[attr-defined]  # found before builtins.exec


def release() -> None:
    """The start is over: write what it compiled that the file lacked (when byte code is
    written), let go of the kept code objects (those no class used are freed) and give
    ``dataclasses`` the real ``exec`` back."""
    if not _installed:
        return
    vars(dataclasses).pop("exec", None)
    if _new and not sys.dont_write_bytecode:
        _write(cache_file(), {**_kept, **_new})
    _kept.clear()
    _new.clear()


#: What a serving node imports, for ``make install`` to compile (see :func:`main`).
SERVE_MODULES = ("ratchet.supervisors.cli", "ratchet.supervisors.cli.serve",
                 "ratchet.supervisors.node.later_children")


def main() -> int:
    """``python -m ratchet.dataclass_code``: write the file afresh with the texts of what a
    serving node imports (stale entries of former versions dropped)."""
    global _installed
    _installed = True
    dataclasses.exec = _exec  # type: ignore[attr-defined]
    for name in SERVE_MODULES:
        importlib.import_module(name)
    _write(cache_file(), dict(_new))
    print(f"{len(_new)} dataclass methods compiled into {cache_file()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
