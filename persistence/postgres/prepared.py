"""Statements of the store's hot path as libpq runs them (psycopg's ``pq`` layer,
postgres/loop_conn.py): prepared once per connection, their arguments encoded by their
declared types — one function per argument, chosen once.

Why not psycopg's adaptation: it is general — a dumper looked up per argument, a list
inspected for its element type at every call — and costs ~110 µs of client CPU for a
five-argument call that libpq itself runs in ~25 µs (measured on this host); a task change
is one call of 40 arguments, 14 of them arrays, on every step's path.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import pq

__all__ = ["Prepared", "error_of"]

_HEAD = struct.Struct("!iiI")  # dimensions, has nulls, element type
_DIM = struct.Struct("!ii")  # length, lower bound
_LEN = struct.Struct("!i")
_INT8 = struct.Struct("!iq")  # length 8, the value
_NULL = b"\xff\xff\xff\xff"  # length -1
_TEXT_OID, _BYTEA_OID, _INT8_OID = 25, 17, 20


def _array(items: Sequence[Any], elem_oid: int, element: Callable[[Any], bytes]) -> bytes:
    """A one-dimensional array in PostgreSQL's binary format."""
    if not items:
        return _HEAD.pack(0, 0, elem_oid)
    parts = [_HEAD.pack(1, int(None in items), elem_oid), _DIM.pack(len(items), 1)]
    for item in items:
        if item is None:
            parts.append(_NULL)
        else:
            data = element(item)
            parts += (_LEN.pack(len(data)), data)
    return b"".join(parts)


def _int8_array(items: Sequence[Any]) -> bytes:
    if not items:
        return _HEAD.pack(0, 0, _INT8_OID)
    return b"".join((_HEAD.pack(1, int(None in items), _INT8_OID), _DIM.pack(len(items), 1),
                     *(_NULL if x is None else _INT8.pack(8, x) for x in items)))


#: Per declared type: its wire format (0 text, 1 binary) and the encoding of a value.
_ENCODERS: dict[str, tuple[int, Callable[[Any], bytes]]] = {
    "text": (0, lambda v: v.encode()),
    "int8": (0, lambda v: b"%d" % v),
    "float8": (0, lambda v: repr(float(v)).encode()),
    "bool": (0, lambda v: b"t" if v else b"f"),
    "bytea": (1, bytes),
    "text[]": (1, lambda v: _array(v, _TEXT_OID, str.encode)),
    "bytea[]": (1, lambda v: _array(v, _BYTEA_OID, bytes)),
    "int8[]": (1, _int8_array),
}


class Prepared:
    """One statement (``$n`` placeholders, each cast to its type in ``sql``) and how its
    arguments are encoded; postgres/loop_conn.py prepares it once per connection."""

    def __init__(self, name: str, sql: str, types: Sequence[str]) -> None:
        self.name = name.encode()
        self.sql = sql.encode()
        self._encoders = [_ENCODERS[t][1] for t in types]
        self.formats = [_ENCODERS[t][0] for t in types]

    def encode(self, args: Sequence[Any]) -> list[bytes | None]:
        """The arguments as libpq sends them (``None``: NULL)."""
        return [None if a is None else enc(a)
                for enc, a in zip(self._encoders, args, strict=True)]


def error_of(res: pq.abc.PGresult, pgconn: pq.abc.PGconn) -> psycopg.Error:
    """The exception psycopg raises for a failed result: by SQLSTATE (``.sqlstate``,
    ``.diag``), ``OperationalError`` when the connection is lost."""
    if pgconn.status == pq.ConnStatus.BAD:
        return psycopg.OperationalError(
            f"the connection is lost: {pgconn.get_error_message()}")
    return psycopg.errors.error_from_result(res)
