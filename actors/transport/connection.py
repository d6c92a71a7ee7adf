"""Opening a client's NATS connection: attempts bounded by one timeout, a refused key told
apart from an unreachable server, and once connected, reconnects at nats-py's own pace (a
key the server comes to refuse closes the connection instead of retrying for minutes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client as NATS

from ratchet.actors.transport.event_feed import Refusals
from ratchet.actors.transport.servers import NatsServers, join_servers, server_list
from ratchet.protocol.auth import redact_url
from ratchet.protocol.errors import NatsUnreachable, Unauthenticated

__all__ = ["open_connection"]

log = structlog.get_logger("ratchet.client")

#: Pause between two connection attempts (pacing; the timeout bounds the whole).
_CONNECT_RETRY_S = 0.25
#: Pause between reconnection attempts once connected (nats-py's default).
_RECONNECT_WAIT_S = 2.0
#: Seconds a single connection attempt may take (TCP, TLS, the server's INFO and PONG).
_ATTEMPT_S = 2.0


def _refused(exc: BaseException) -> bool:
    """Whether NATS refused the connection's credentials (nats-py reports it as an
    AuthorizationError, or at connect as the server's ``Authorization Violation``)."""
    return isinstance(exc, nats.errors.AuthorizationError) \
        or "authorization violation" in str(exc).lower()


def _nats_with_error_handler(
        refusals: Refusals) -> tuple[NATS, Callable[[Exception], Awaitable[None]],
                                     Callable[[], None]]:
    """A NATS connection, its error callback, and what to call once it is connected (from
    then on, a reconnect and errors are logged; before, the caller reports the failure)."""
    nc = NATS()
    closing: set[asyncio.Task[None]] = set()
    connected = False

    async def on_error(exc: Exception) -> None:
        refusals.report(exc)
        if not connected:
            return
        log.warning("nats error", error=str(exc) or type(exc).__name__)
        if not _refused(exc):
            return
        # A key the server refuses (revoked) stays refused: stop trying instead of
        # retrying for minutes; closed from a task of its own since close() cancels the
        # reconnect loop calling us.
        nc.options["allow_reconnect"] = False
        task = asyncio.get_running_loop().create_task(nc.close())
        closing.add(task)
        task.add_done_callback(closing.discard)

    def now_connected() -> None:
        nonlocal connected
        connected = True
        # From now on, ride out server restarts at nats-py's own pace.
        nc.options["allow_reconnect"] = True
        nc.options["connect_timeout"] = _ATTEMPT_S
        nc.options["reconnect_time_wait"] = _RECONNECT_WAIT_S

    return nc, on_error, now_connected


async def _attempt(nc: NATS, url: NatsServers, on_error: Callable[[Exception],
                   Awaitable[None]], within: float, options: dict[str, Any]) -> None:
    """One connection attempt, bounded by ``within`` seconds. nats-py retries a server
    that refuses TCP (about two minutes by default; here every 0.25 s, the bound cutting
    it short) but gives up at the first failure after TCP (a timeout, a hang-up)."""
    attempts: dict[str, Any] = {"connect_timeout": min(_ATTEMPT_S, within),
                                "reconnect_time_wait": _CONNECT_RETRY_S}
    async with asyncio.timeout(within):
        await nc.connect(server_list(url), name="ratchet-client", error_cb=on_error,
                         allow_reconnect=False, **attempts, **options)


async def open_connection(url: NatsServers, key: str | None, options: dict[str, Any],
                          connect_timeout: float) -> tuple[NATS, Refusals]:
    """A connected NATS client and the refusals its server reports. ``key``: the public
    key authenticating (for the error); ``options``: nats-py's nkey options.

    Raises Unauthenticated when the server refuses the key, NatsUnreachable when no
    attempt succeeds within ``connect_timeout`` seconds."""
    shown = redact_url(join_servers(url))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + connect_timeout
    while True:
        refusals = Refusals()
        nc, on_error, connected = _nats_with_error_handler(refusals)
        try:
            await _attempt(nc, url, on_error, max(deadline - loop.time(), 0.0), options)
            connected()
            return nc, refusals
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            if _refused(exc) or refusals.credentials_refused:
                raise Unauthenticated(
                    "the NATS server refused the connection: no key, or a key it does"
                    " not know (docs/security.md)", key=key) from None
            # A server that took the connection and then timed out or hung up (busy,
            # reloading its users) is asked again while the timeout lasts.
            if loop.time() + _CONNECT_RETRY_S >= deadline:
                raise NatsUnreachable(f"cannot reach NATS at {shown}", url=shown,
                                      timeout_s=connect_timeout) from None
            await asyncio.sleep(_CONNECT_RETRY_S)  # pacing between attempts
