"""The NATS a chaos run uses (bench/chaos.py): one embedded server, or with
``--nats-cluster N`` a loopback cluster of N servers (ratchet/testing/nats_cluster.py)
whose streams the nodes keep with N replicas, and whose servers the runs SIGKILL in turn.

On a cluster each kill of a node is preceded by the SIGKILL of one NATS server (the next
in turn); the server killed by the run before is started again first (on its ports and
store, JetStream ready), so a quorum is always there: what is tested is that the nodes
ride out a server's loss, not that JetStream survives losing two of three.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import nats.errors
import nats.js.errors

from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.testing.nats_cluster import NatsCluster

__all__ = ["NatsUnderTest", "retrying"]

T = TypeVar("T")


async def retrying(publish: Callable[[], Awaitable[T]], attempts: int = 6) -> T:
    """A JetStream publish (``Client.submit``), again on a timeout: what a producer does
    while a stream elects a new leader after a server's loss. Safe because the publish
    carries the same ``Nats-Msg-Id`` each time (the stream drops a repeat). "No responders"
    and "no response from stream" are the same election seen from the client."""
    for _ in range(attempts - 1):
        try:
            return await publish()
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError,
                nats.js.errors.NoStreamResponseError):  # no stream leader answering yet
            await asyncio.sleep(0.5)  # a producer's retry pacing
    return await publish()


class NatsUnderTest:
    def __init__(self, base: Path, cluster_size: int = 0) -> None:
        self.cluster = NatsCluster(base / "nats-cluster", cluster_size) if cluster_size > 1 \
            else None
        self.server = None if self.cluster else EmbeddedNats(base / "nats")
        self.kills = 0
        self._down: int | None = None

    async def start(self) -> str:
        """The URL (a cluster: its servers, comma-separated) for the nodes and clients."""
        if self.cluster is not None:
            await self.cluster.start()
            return self.cluster.url
        assert self.server is not None
        return await self.server.start()

    @property
    def node_args(self) -> tuple[str, ...]:
        """``serve`` flags the nodes need on a cluster: the streams' replicas, and time to
        start through a leader election (JetStream's Raft waits 4-9 s before electing)."""
        return () if self.cluster is None else (
            "--nats-replicas", str(len(self.cluster.servers)), "--nats-connect-timeout", "30")

    async def strike(self, run: int) -> None:
        """On a cluster: start the server killed last again, then SIGKILL the next."""
        if self.cluster is None:
            return
        if self._down is not None:
            await self.cluster.restart(self._down)
        self._down = run % len(self.cluster.servers)
        self.cluster.kill(self._down)
        self.kills += 1

    def summary(self) -> dict[str, Any]:
        if self.cluster is None:
            return {}
        return {"nats_servers": len(self.cluster.servers), "nats_server_kills": self.kills}

    async def stop(self) -> None:
        if self.cluster is not None:
            await self.cluster.stop()
        if self.server is not None:
            await self.server.stop()
