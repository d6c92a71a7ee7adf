"""The node's secret key: what seals secrets at rest (protocol/secrets.py).

Read from ``RATCHET_SECRET_KEY`` (32 bytes, base64 or hex) if set, else from
``<state_dir>/keys/secrets.key``, which a node creates on its store's first start (mode 0600,
in a directory of mode 0700). A store that already holds secrets never gets a key made for it:
with no key to be found the node refuses to start (:class:`SecretUnreadable`), since a new key
could open none of them. Losing the key loses the secrets, and only them: everything else of
a task stays readable. Back it up with the database, but not in the same place.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from collections.abc import Mapping
from pathlib import Path

import structlog

from ratchet.protocol.errors import SecretUnreadable
from ratchet.protocol.secrets import KEY_SIZE

__all__ = ["KEY_ENV", "KEY_FILE", "load_secret_key", "parse_key"]

log = structlog.get_logger("ratchet.node")

#: The environment variable a key is read from first.
KEY_ENV = "RATCHET_SECRET_KEY"
#: The key file, under the state directory.
KEY_FILE = Path("keys/secrets.key")


def parse_key(text: str) -> bytes:
    """A key from its text: 64 hex digits, or base64 (standard or URL-safe) of 32 bytes.

    Raises:
        ValueError: anything else.
    """
    text = text.strip()
    if len(text) == 2 * KEY_SIZE:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    try:
        key = base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"a secret key is {KEY_SIZE} bytes in base64 or hex") from None
    if len(key) != KEY_SIZE:
        raise ValueError(f"a secret key is {KEY_SIZE} bytes, this one {len(key)}")
    return key


def load_secret_key(state_dir: Path, environ: Mapping[str, str] | None = None, *,
                    sealed_under: list[str] | None = None) -> bytes:
    """The node's key: from ``environ`` (default ``os.environ``), else the key file, else a
    new key file — unless ``sealed_under`` names the keys the store's secrets already need.

    Raises:
        SecretUnreadable: a malformed key, or none for a store that holds secrets.
    """
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV):
        try:
            return parse_key(env[KEY_ENV])
        except ValueError as exc:
            raise SecretUnreadable(f"{KEY_ENV}: {exc}") from None
    path = Path(state_dir) / KEY_FILE
    if not path.exists() and sealed_under:
        raise SecretUnreadable(
            f"no secret key: this store's secrets are sealed under key {sealed_under[0]};"
            f" set {KEY_ENV} or restore {path}", path=str(path), store_key_ids=sealed_under)
    if not path.exists():
        _create(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("the secret key file can be read by others", path=str(path),
                    mode=oct(mode))
    try:
        return parse_key(path.read_text())
    except ValueError as exc:
        raise SecretUnreadable(f"{path}: {exc}", path=str(path)) from None


def _create(path: Path) -> None:
    """Write a new random key to ``path`` (0600, directory 0700). Another node of the same
    state directory may do it at the same moment: the first link wins, both read it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # mkdir's mode is cut by the umask; an old one is tightened
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, base64.b64encode(os.urandom(KEY_SIZE)) + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces a key another node just wrote
        log.info("secret key created", path=str(path))
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
