"""How a client on this machine finds the key of a local node's embedded NATS.

A ``ratchet serve`` that starts its own nats-server (the single-machine default) refuses
anonymous connections: every connection needs a key (docs/security.md). A program of the
same OS user that only knows the node's URL (a script, a benchmark harness, a notebook)
would otherwise have to be told where the state dir's ``keys/local-admin.nk`` is. So the
node writes one small entry per embedded server into a per-user registry::

    $RATCHET_LOCAL_NODES  or  $XDG_STATE_HOME/ratchet/local-nodes  or
    ~/.local/state/ratchet/local-nodes            (directory 0700, entries 0600)
        127.0.0.1_4222.json  {"url": ..., "creds": "<state dir>/keys/local-admin.nk", "pid": ...}

and :meth:`Client.connect` without ``creds`` looks there (after ``$RATCHET_CREDS``).

Why this widens nothing: the entry only says *where* the key is; reading the key still
needs the permissions of the state dir (0700, its owner). The lookup is refused unless the
URL is a loopback address, and unless the entry and the key file are owned by the user
asking and unreadable to anyone else, so another user cannot plant an entry pointing a
client at a key of their choosing. A node removes its entry when it stops; an entry left by
a killed node is overwritten by the next node on that port, and a stale one only yields a
key the server refuses (``Unauthenticated``), never a connection to the wrong node's data.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

from ratchet.actors.transport.servers import NatsServers, server_list

__all__ = ["REGISTRY_ENV", "CREDS_ENV", "registry_dir", "register", "unregister",
           "discover_creds"]

REGISTRY_ENV = "RATCHET_LOCAL_NODES"
CREDS_ENV = "RATCHET_CREDS"


def registry_dir() -> Path:
    """Where this user's entries live (see the module docstring)."""
    given = os.environ.get(REGISTRY_ENV)
    if given:
        return Path(given)
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "ratchet" / "local-nodes"


def _loopback_address(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``nats://`` URL on a loopback address, else None."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or 4222
    except ValueError:
        return None
    if host == "localhost":
        return "127.0.0.1", port
    try:
        return (host, port) if ipaddress.ip_address(host).is_loopback else None
    except ValueError:
        return None


def _entry_path(host: str, port: int) -> Path:
    return registry_dir() / f"{host.replace(':', '_')}_{port}.json"


def register(url: str, creds: Path, pid: int) -> Path | None:
    """Write the entry of an embedded server at ``url`` (a loopback URL; else nothing is
    written and None returned). Atomic: a reader sees the old entry or the new one."""
    address = _loopback_address(url)
    if address is None:
        return None
    folder = registry_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = _entry_path(*address)
    partial = path.with_suffix(f".{pid}.tmp")
    body = json.dumps({"url": url, "creds": str(Path(creds).resolve()), "pid": pid})
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(body)
    os.replace(partial, path)
    return path


def unregister(url: str, pid: int) -> None:
    """Remove the entry for ``url`` if this process (``pid``) wrote it."""
    address = _loopback_address(url)
    if address is None:
        return
    path = _entry_path(*address)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()


def _private_to_me(path: Path) -> bool:
    """Owned by this user, a regular file, and neither group- nor world-accessible."""
    try:
        info = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() \
        and info.st_mode & 0o077 == 0


def discover_creds(servers: NatsServers) -> Path | None:
    """The key to connect to ``servers`` with when the caller gave none: ``$RATCHET_CREDS``,
    else the registry entry of the first loopback server that has a private one."""
    given = os.environ.get(CREDS_ENV)
    if given:
        return Path(given)
    for url in server_list(servers):
        address = _loopback_address(url)
        if address is None:
            continue
        entry = _entry_path(*address)
        if not _private_to_me(entry):
            continue
        try:
            creds = Path(json.loads(entry.read_text())["creds"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _private_to_me(creds):
            return creds
    return None
