"""One asyncio lock per key, kept only while someone holds or waits for it.

Why not ``dict.setdefault(key, asyncio.Lock())`` and a ``pop`` when the work is done: a
pop while a holder is inside (or a waiter is queued) lets the next caller make a second
lock for the same key, and two callers then run at once — what the lock was for. Here the
entry goes when its last user leaves, and a map of locks does not grow with every key
ever used.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

__all__ = ["KeyedLock"]

K = TypeVar("K", bound=Hashable)


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class KeyedLock(Generic[K]):
    """``async with locks.hold(key):`` — one caller per key at a time."""

    def __init__(self) -> None:
        self._entries: dict[K, _Entry] = {}

    def __len__(self) -> int:
        """Keys held or waited for now."""
        return len(self._entries)

    @asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]
