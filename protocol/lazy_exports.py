"""A package's public names imported at their first use (PEP 562), so that importing the
package — ``import ratchet`` in a user's program, or the ``ratchet serve`` start (see
docs/operations.md, "Restart (W4)") — loads only the modules that are used."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: dict[str, tuple[str, ...]], namespace: dict[str, Any],
                 public: list[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``where`` maps each module to the
    names it gives; a name is imported once, then kept in ``namespace`` (the package's
    ``globals()``) so that later reads are plain attribute reads."""
    modules = {name: module for module, names in where.items() for name in names}

    def getattr_(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(public))

    return getattr_, dir_
