"""The audit chain's key as given to a node: what nodes on several machines share.

Read from ``RATCHET_AUDIT_KEY`` (32 bytes: 64 hex digits, or base64) if set, else from the
file ``--audit-key-file`` names (the same text); with neither, the node uses its state
directory's ``keys/audit.key``, created on the first start (persistence/audit_seal.py), which
is what one machine needs. The store records the key's check value, and a node given
another key is refused at start (``AUDIT_KEY_MISMATCH``, persistence/audit_key.py).
Generate one with ``python -c 'import secrets; print(secrets.token_hex(32))'``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

import structlog

from ratchet.protocol.errors import UsageError
from ratchet.supervisors.node.secret_key import parse_key

__all__ = ["AUDIT_KEY_ENV", "load_audit_key"]

log = structlog.get_logger("ratchet.node")

#: The environment variable the audit key is read from first.
AUDIT_KEY_ENV = "RATCHET_AUDIT_KEY"


def load_audit_key(key_file: Path | None,
                   environ: Mapping[str, str] | None = None) -> bytes | None:
    """The key from ``environ`` (default ``os.environ``), else from ``key_file``; None when
    neither is given (the state directory's key file is used).

    Raises:
        UsageError: a malformed key, or a key file that cannot be read.
    """
    env = os.environ if environ is None else environ
    if env.get(AUDIT_KEY_ENV):
        try:
            return parse_key(env[AUDIT_KEY_ENV])
        except ValueError as exc:
            raise UsageError(f"{AUDIT_KEY_ENV}: {_audit(exc)}") from None
    if key_file is None:
        return None
    path = Path(key_file)
    try:
        text = path.read_text()
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise UsageError(f"--audit-key-file {path}: {exc.strerror or exc!r}") from None
    if mode & 0o077:
        log.warning("the audit key file can be read by others", path=str(path), mode=oct(mode))
    try:
        return parse_key(text)
    except ValueError as exc:
        raise UsageError(f"--audit-key-file {path}: {_audit(exc)}") from None


def _audit(exc: ValueError) -> str:
    return str(exc).replace("a secret key", "an audit key")
