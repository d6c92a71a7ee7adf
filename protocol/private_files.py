"""Files only their owner may read (0600, in a 0700 folder), replaced atomically: keys,
seeds, the audit head, the embedded server's users. One writer for all of them."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_private"]


def write_private(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Replace ``path`` with ``data``: readers see the old file or the new, never half.

    ``durable``: fsync the file and its folder before returning (a key whose loss loses
    what it protects). The temporary name carries the pid: processes sharing a state
    directory never write into each other's."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        if durable:
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, path)
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the name too
        finally:
            os.close(folder)
