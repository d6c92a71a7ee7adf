"""Tool sessions' state rows (``tool_sessions``): the port (:class:`SessionStore`, part of
``TaskStore``) and the Store's mixin (:class:`SessionRows`).

A session's state may be written by several nodes: its task's, and those running the
task's fan-out branches (actors/task/branch_sessions.py). Each row has a version
(migration 25). A call's change is written as *that change*: ``before`` → ``after`` read
at ``version``. If the row is still at ``version``, ``after`` is written; if another writer
came first, the change is applied over the state now stored, key by key (:func:`merged`),
in the same transaction — so no writer's change erases another's, and none is retried
outside the store: the write lock (SQLite) or the row's compare-and-set, looped in the
transaction (PostgreSQL), decides the order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ratchet.persistence.writer import Writer
from ratchet.protocol.secrets import Sealer

__all__ = ["SessionRows", "SessionStore", "merged"]

T = TypeVar("T")

#: Compare-and-set attempts in one transaction (PostgreSQL: a concurrent writer's commit
#: between the read and the update; SQLite's write lock makes the first one succeed).
_ATTEMPTS = 50


def merged(fresh: dict[str, Any], before: dict[str, Any],
           after: dict[str, Any]) -> dict[str, Any]:
    """``fresh`` with the changes that turned ``before`` into ``after`` (top-level keys)."""
    out = dict(fresh)
    for key in before.keys() - after.keys():
        out.pop(key, None)
    for key, value in after.items():
        if key not in before or before[key] != value:
            out[key] = value
    return out


class SessionStore(Protocol):
    """A task's tool sessions' state (part of ``TaskStore``)."""

    async def session_state(self, task_id: str, session: str) -> dict[str, Any]:
        ...

    async def session_state_at(self, task_id: str, session: str
                               ) -> tuple[dict[str, Any], int]:
        """The session's state and its version (0: never written)."""
        ...

    async def save_session_state(self, task_id: str, session: str, state: dict[str, Any],
                                 now: float) -> None:
        """Write the session's state whatever its version (and count one more)."""
        ...

    async def merge_session_state(self, task_id: str, session: str, before: dict[str, Any],
                                  after: dict[str, Any], version: int, now: float
                                  ) -> tuple[dict[str, Any], int, bool]:
        """Write a call's change of the state (module doc): ``after`` if the version is
        still ``version``, else the change applied over the state stored. Returns the
        state and version now stored, and whether another writer had come first."""
        ...


class SessionRows:
    """:class:`SessionStore` of the Store (what it uses of the Store is declared here)."""

    _writer: Writer
    secrets: Sealer

    def _fenced(self, task_id: str, fn: Callable[[sqlite3.Connection], T]
                ) -> Callable[[sqlite3.Connection], T]:
        raise NotImplementedError

    async def _row(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        raise NotImplementedError

    async def session_state(self, task_id: str, session: str) -> dict[str, Any]:
        return (await self.session_state_at(task_id, session))[0]

    async def session_state_at(self, task_id: str, session: str
                               ) -> tuple[dict[str, Any], int]:
        row = await self._row(
            "SELECT state, version FROM tool_sessions WHERE task_id = ? AND session = ?",
            (task_id, session))
        return ({}, 0) if row is None else (dict(self.secrets.unpack(row[0])), int(row[1]))

    async def save_session_state(self, task_id: str, session: str, state: dict[str, Any],
                                 now: float) -> None:
        packed = self.secrets.pack(state)  # a token kept as SecretStr is sealed

        def txn(conn: sqlite3.Connection) -> None:
            updated = conn.execute(
                "UPDATE tool_sessions SET state = ?, updated_at = ?, version = version + 1"
                " WHERE task_id = ? AND session = ?", (packed, now, task_id, session))
            if updated.rowcount == 0:
                conn.execute(
                    "INSERT OR IGNORE INTO tool_sessions(task_id, session, state, updated_at,"
                    " version) VALUES (?,?,?,?,1)", (task_id, session, packed, now))

        await self._writer.submit(self._fenced(task_id, txn))

    async def merge_session_state(self, task_id: str, session: str, before: dict[str, Any],
                                  after: dict[str, Any], version: int, now: float
                                  ) -> tuple[dict[str, Any], int, bool]:
        secrets, packed = self.secrets, self.secrets.pack(after)

        def txn(conn: sqlite3.Connection) -> tuple[dict[str, Any], int, bool]:
            for _ in range(_ATTEMPTS):
                row = conn.execute(
                    "SELECT state, version FROM tool_sessions WHERE task_id = ?"
                    " AND session = ?", (task_id, session)).fetchone()
                if row is None:
                    inserted = conn.execute(
                        "INSERT OR IGNORE INTO tool_sessions(task_id, session, state,"
                        " updated_at, version) VALUES (?,?,?,?,1)",
                        (task_id, session, packed, now))
                    if inserted.rowcount == 1:
                        return after, 1, version != 0
                    continue
                stored = int(row[1])
                raced = stored != version
                state = merged(dict(secrets.unpack(row[0])), before, after) if raced else after
                updated = conn.execute(
                    "UPDATE tool_sessions SET state = ?, updated_at = ?, version = ?"
                    " WHERE task_id = ? AND session = ? AND version = ?",
                    (secrets.pack(state) if raced else packed, now, stored + 1, task_id,
                     session, stored))
                if updated.rowcount == 1:
                    return state, stored + 1, raced
            raise sqlite3.OperationalError(f"session {session}: {_ATTEMPTS} writes lost")

        result: tuple[dict[str, Any], int, bool] = await self._writer.submit(
            self._fenced(task_id, txn))
        return result
