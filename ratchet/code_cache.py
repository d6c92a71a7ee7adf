"""Code the standard library compiles from text as a start defines classes, compiled once
and kept between starts of the ``ratchet`` command (docs/operations.md, "Restart (W4)").

Three places in Python 3.11 and 3.12 compile source text while modules are imported:
``@dataclass`` writes each method it adds (``__init__``, ``__repr__``, ``__eq__``, a frozen
class's ``__setattr__``...) as text and ``exec``\\ s it; ``typing.ForwardRef`` compiles
each annotation given as a string (pydantic-core alone declares ~700 in its TypedDicts);
``collections.namedtuple`` ``eval``\\ s its ``__new__``. A ``ratchet serve`` start compiled
~1,800 such texts, ~130 ms of its ~450 ms of imports here, the same texts every time, so
the same code objects. :func:`install` gives those three modules stand-ins for ``exec``,
``compile`` and ``eval`` (module globals, found before the builtins) that run the code
object kept for a text and compile only a text not kept; the kept ones are read as the
command starts (~5 ms) from a file beside the package's byte code.

What runs is what ran before: ``compile(text, "<string>", mode, dont_inherit=True)`` is
what ``exec``/``eval``/``compile`` of that text compiles in those modules (none has a
``__future__`` import), and the code object is run with the same globals and namespace; a
text that does not compile raises as it did. Texts are keyed by the BLAKE2b digest (128
bits) of their mode and text, in a file stamped with the interpreter's byte-code magic
number: another Python version reads none of it. A file that cannot be read is no file
(everything compiles, as before): the cache is never why a command fails.

Written (atomically: a temporary file renamed) by ``make install`` (``python -m
ratchet.code_cache``: the texts of what a serving node imports, afresh), and by the command
at the end of a start (:func:`release`) when the start compiled texts the file lacked (up
to :data:`MAX_KEPT` texts) —
unless byte code is not written (``PYTHONDONTWRITEBYTECODE``, ``-B``), as for ``.pyc``
files. Only the ``ratchet`` command installs it (``ratchet/__main__.py``), until the end of
its start; ``import ratchet`` in a user's process leaves the standard library alone.
Python 3.13 compiles a dataclass's methods in one text already: nothing is done there.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.util
import marshal
import os
import sys
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

__all__ = ["MAX_KEPT", "cache_file", "install", "release"]

#: The most texts a start adds to the file (a start's own are ~1,200): texts of code
#: changed since (an application's dataclasses, deploy after deploy) are never dropped
#: from it but by ``make install``, so past this bound a start compiles them as before.
MAX_KEPT = 20_000

_kept: dict[bytes, CodeType] = {}
_new: dict[bytes, CodeType] = {}
#: The modules given a stand-in, and the name it shadows in each.
_patched: list[tuple[ModuleType, str]] = []
_file: Path | None = None


def cache_file() -> Path:
    """Where the kept code objects are: ``ratchet/__pycache__`` (or under
    ``sys.pycache_prefix``), named for this interpreter."""
    pyc = Path(importlib.util.cache_from_source(__file__))
    return pyc.with_name(f"compiled-code.{sys.implementation.cache_tag}.bin")


def _code(source: str, mode: str) -> CodeType:
    key = hashlib.blake2b(f"{mode}\0{source}".encode(), digest_size=16).digest()
    code = _kept.get(key) or _new.get(key)
    if code is None:
        code = builtins.compile(source, "<string>", mode, dont_inherit=True)
        _new[key] = code
    return code


def _exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:
    """``exec`` for ``dataclasses``."""
    if type(source) is str:
        source = _code(source, "exec")
    return builtins.exec(source, globals, locals)


def _eval(source: Any, globals: Any = None, locals: Any = None, /) -> Any:
    """``eval`` for ``collections``."""
    if type(source) is str:
        source = _code(source, "eval")
    return builtins.eval(source, globals, locals)


def _compile(source: Any, filename: str, mode: str, flags: int = 0,
             dont_inherit: bool = False, optimize: int = -1) -> Any:
    """``compile`` for ``typing`` (its forward references: text, ``"<string>"``, ``"eval"``)."""
    if type(source) is str and filename == "<string>" and not flags and optimize == -1:
        return _code(source, mode)
    return builtins.compile(source, filename, mode, flags, True, optimize)


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
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(importlib.util.MAGIC_NUMBER + marshal.dumps(codes))
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError:  # a read-only install: every start compiles, as without the cache
        pass


def install(path: Path | None = None) -> None:
    """Read the kept code objects (from ``path``, by default :func:`cache_file`) and give
    the three modules their stand-ins (once; nothing on Python 3.13 and later)."""
    global _file
    if _patched or sys.version_info >= (3, 13):
        return
    import collections
    import dataclasses
    import typing

    _file = path or cache_file()
    _kept.update(_read(_file))
    for module, name, stand_in in ((dataclasses, "exec", _exec), (typing, "compile", _compile),
                                   (collections, "eval", _eval)):
        if name not in vars(module):  # a module with a name of its own is left alone
            setattr(module, name, stand_in)
            _patched.append((module, name))


def release() -> None:
    """The start is over: give the modules the builtins back, write what the start compiled
    that the file lacked (when byte code is written), and let go of the kept code objects
    (those no class used are freed)."""
    while _patched:
        module, name = _patched.pop()
        vars(module).pop(name, None)
    if _new and _file is not None and not sys.dont_write_bytecode \
            and len(_kept) + len(_new) <= MAX_KEPT:
        _write(_file, {**_kept, **_new})
    _kept.clear()
    _new.clear()


#: What a serving node imports, for ``make install`` to compile (see :func:`main`).
SERVE_MODULES = ("ratchet.supervisors.cli", "ratchet.supervisors.cli.serve",
                 "ratchet.supervisors.node.later_children")


def main(argv: list[str] | None = None) -> int:
    """``python -m ratchet.code_cache [FILE]``: write the file (default :func:`cache_file`)
    afresh with the texts compiled as a serving node's modules are imported (stale entries
    of former versions dropped)."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else cache_file()
    install(Path(os.devnull))  # nothing kept: every text is compiled, and so collected
    for name in SERVE_MODULES:
        importlib.import_module(name)
    compiled = dict(_new)
    _write(path, compiled)
    print(f"{len(compiled)} compiled texts kept in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
