"""NATS server lists: one URL, several comma-separated, or a list of them (a cluster).

A node or a client given several servers connects to one (nats-py shuffles the list) and,
when it goes, reconnects to another; it also learns the cluster's other servers from the
one it is connected to. ``ratchet serve --nats-url`` and the client commands take the list
comma-separated, the flag repeated, or both; ``$RATCHET_NATS_URL`` comma-separated.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["NatsServers", "join_servers", "server_list"]

#: What names the servers: ``"nats://a:4222,nats://b:4222"`` or a list of such strings.
NatsServers = str | Iterable[str]


def server_list(servers: NatsServers) -> list[str]:
    """Every URL ``servers`` names, in order, blanks dropped.

    Raises:
        ValueError: it names none.
    """
    parts = [servers] if isinstance(servers, str) else list(servers)
    urls = [url.strip() for part in parts for url in part.split(",") if url.strip()]
    if not urls:
        raise ValueError("no NATS server URL given")
    return urls


def join_servers(servers: NatsServers | None) -> str | None:
    """The servers as one comma-separated string (None stays None): how a node keeps and
    shows them (``NodeConfig.nats_url``, the serving line)."""
    if servers is None:
        return None
    return ",".join(server_list(servers))
