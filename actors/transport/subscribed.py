"""Knowing the server has a subscription before relying on it.

Why not ``await nc.flush()`` after ``subscribe``, as NATS clients are used: nats-py queues
a SUB for its flusher task, but ``flush`` writes its PING to the socket at once, ahead of
that queue. The PONG then proves nothing about the SUB, and a request published on another
connection right after can find no responder (seen: a request service's first request,
under load, answered "no responders"). :func:`subscriptions_registered` waits until
nats-py's queue is written, then sends a PING that leaves after it: the server answers
a connection's commands in order, so that PONG comes after every SUB made before.
"""

from __future__ import annotations

from nats.aio.client import Client as NATS

__all__ = ["subscriptions_registered"]

#: Round trips spent waiting for the flusher to write its queue (it runs as soon as the
#: loop turns; more than one only while the socket is full).
_ROUNDS = 5


async def subscriptions_registered(nc: NATS, timeout: int = 10) -> None:
    """Return once the server has read every command this connection queued before the call
    (its SUBs and UNSUBs included).

    Raises:
        nats.errors.FlushTimeoutError: no answer within ``timeout`` seconds a round trip.
        nats.errors.ConnectionClosedError: the connection is closed.
    """
    await nc.flush(timeout)  # wakes the flusher (its PING may precede the queue)
    for _ in range(_ROUNDS):
        # nats-py's count of bytes queued and not yet written (its flush adds its PING's
        # bytes, written already, until the flusher runs and resets it).
        if not getattr(nc, "_pending_data_size", 0):
            break
        await nc.flush(timeout)
    await nc.flush(timeout)  # this PING leaves after the queue: its PONG proves it read
