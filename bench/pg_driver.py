"""Which PostgreSQL driver the store uses: asyncpg or psycopg 3, measured.

Over the Unix socket of a throwaway server (the ``pgserver`` wheel's PostgreSQL 16), each
driver runs the same two loads, one after another, for ``--seconds`` each:

- ``commits``: single-row INSERT commits, one at a time (autocommit): the round trip plus
  the commit's WAL flush.
- ``step_txn``: a step-shaped transaction (BEGIN, SELECT of the task row FOR UPDATE, three
  INSERTs, an UPDATE, COMMIT): what one state change costs in round trips.

psycopg runs both from a plain thread (as the store's writer does) and from asyncio;
asyncpg only from asyncio. Prints one JSON line (figures in docs/operations.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

_DDL = """
DROP TABLE IF EXISTS t_rows, t_tasks;
CREATE TABLE t_rows (id BIGSERIAL PRIMARY KEY, task_id TEXT NOT NULL, body BYTEA NOT NULL);
CREATE TABLE t_tasks (task_id TEXT PRIMARY KEY, version BIGINT NOT NULL);
INSERT INTO t_tasks VALUES ('t1', 0);
"""
_BODY = b"x" * 200


def _rate(seconds: float, once: Callable[[], None]) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        once()
        n += 1
    return n / (time.perf_counter() - start)


async def _arate(seconds: float, once: Callable[[], Awaitable[Any]]) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        await once()
        n += 1
    return n / (time.perf_counter() - start)


def psycopg_sync(dsn: str, seconds: float) -> dict[str, float]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_DDL)

        def commit() -> None:
            conn.execute("INSERT INTO t_rows(task_id, body) VALUES (%s, %s)", ("t1", _BODY))

        def step() -> None:
            with conn.transaction():
                v = conn.execute("SELECT version FROM t_tasks WHERE task_id = %s FOR UPDATE",
                                 ("t1",)).fetchone()
                for _ in range(3):
                    conn.execute("INSERT INTO t_rows(task_id, body) VALUES (%s, %s) RETURNING id",
                                 ("t1", _BODY)).fetchone()
                conn.execute("UPDATE t_tasks SET version = %s WHERE task_id = %s AND version = %s",
                             (v[0] + 1, "t1", v[0]))

        return {"commits_per_s": _rate(seconds, commit), "step_txn_per_s": _rate(seconds, step)}


async def psycopg_async(dsn: str, seconds: float) -> dict[str, float]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with conn:
        await conn.execute(_DDL)

        async def commit() -> None:
            await conn.execute("INSERT INTO t_rows(task_id, body) VALUES (%s, %s)", ("t1", _BODY))

        async def step() -> None:
            async with conn.transaction():
                cur = await conn.execute(
                    "SELECT version FROM t_tasks WHERE task_id = %s FOR UPDATE", ("t1",))
                v = await cur.fetchone()
                assert v is not None
                for _ in range(3):
                    cur = await conn.execute(
                        "INSERT INTO t_rows(task_id, body) VALUES (%s, %s) RETURNING id",
                        ("t1", _BODY))
                    await cur.fetchone()
                await conn.execute(
                    "UPDATE t_tasks SET version = %s WHERE task_id = %s AND version = %s",
                    (v[0] + 1, "t1", v[0]))

        return {"commits_per_s": await _arate(seconds, commit),
                "step_txn_per_s": await _arate(seconds, step)}


async def asyncpg_async(dsn: str, seconds: float) -> dict[str, float]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(_DDL)

        async def commit() -> None:
            await conn.execute("INSERT INTO t_rows(task_id, body) VALUES ($1, $2)", "t1", _BODY)

        async def step() -> None:
            async with conn.transaction():
                v = await conn.fetchval(
                    "SELECT version FROM t_tasks WHERE task_id = $1 FOR UPDATE", "t1")
                for _ in range(3):
                    await conn.fetchval(
                        "INSERT INTO t_rows(task_id, body) VALUES ($1, $2) RETURNING id",
                        "t1", _BODY)
                await conn.execute(
                    "UPDATE t_tasks SET version = $1 WHERE task_id = $2 AND version = $3",
                    v + 1, "t1", v)

        return {"commits_per_s": await _arate(seconds, commit),
                "step_txn_per_s": await _arate(seconds, step)}
    finally:
        await conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dsn", default=None, help="default: a throwaway pgserver")
    args = ap.parse_args()
    server = None
    dsn = args.dsn
    if dsn is None:
        import pgserver

        server = pgserver.get_server(tempfile.mkdtemp(prefix="ratchet-pgbench-"),
                                     cleanup_mode="delete")
        dsn = server.get_uri()
    try:
        out: dict[str, Any] = {}
        for name, figures in (
            ("psycopg_thread", psycopg_sync(dsn, args.seconds)),
            ("psycopg_async", asyncio.run(psycopg_async(dsn, args.seconds))),
            ("asyncpg", asyncio.run(asyncpg_async(dsn, args.seconds))),
        ):
            for key, value in figures.items():
                out[f"{name}_{key}"] = round(value)
        print(json.dumps(out))
    finally:
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    main()
