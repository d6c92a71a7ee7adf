"""No cyclic garbage collection while ``ratchet serve`` starts (docs/operations.md,
"Restart (W4)").

A start allocates a few hundred thousand objects that live as long as the process (modules,
classes, functions, the pydantic models' validators) and almost no cyclic garbage; the
collector, counting allocations, still ran ~130 times over them during the imports alone
(~35 ms here, 10 % of them). So the ``ratchet`` command holds the collector off from its
first import (``ratchet/__main__.py``, the command's entry point, which hands the hold
over to this module: :func:`adopt`) and releases it once the node serves (or its start
ended otherwise), or at once for any other command. Released, what the start
allocated is frozen (``gc.freeze``): moved out of the generations the collector scans, so
the collections of a running node no longer walk it. Reference counting frees everything
else as usual meanwhile; only reference cycles made while starting wait (they are few).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

__all__ = ["adopt", "at_release", "release"]

_held = False
_then: list[Callable[[], None]] = []


def adopt() -> None:
    """The entry point stopped the collector (it was running): :func:`release` starts it."""
    global _held
    _held = not gc.isenabled()


def at_release(then: Callable[[], None]) -> None:
    """Call ``then`` (once) when the start ends, at :func:`release`: the command's entry
    point hands over the end of its other start-only measure this way
    (ratchet/code_cache.py)."""
    _then.append(then)


def release() -> None:
    """Undo the entry point's hold (nothing if it made none): freeze what is allocated, collect
    again; and call what :func:`at_release` was given."""
    global _held
    while _then:
        _then.pop(0)()
    if _held:
        _held = False
        gc.freeze()
        gc.enable()
