"""The outbox relay: publishes what the Store committed to the outbox, then deletes it.

Rows arrive two ways: announced by the Store right after each commit (the fast path, no
query), and by scanning the table at start and every ``sweep_interval`` (whatever a crash
or a failed publish left behind). Each row is published with ``Nats-Msg-Id`` = its
message id, so a row published twice (a crash between publish and delete) is dropped by
JetStream's duplicate window; subscribers also dedupe events by ``sequence``.
Rows are published in id order per batch, so a task's events keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

import structlog

from actors.bus import Bus
from actors.core import ServiceActor
from persistence.store import Store
from persistence.txns import OutboxRow
from protocol.clock import Clock

__all__ = ["OutboxRelay"]

log = structlog.get_logger("ratchet.outbox")


class OutboxRelay(ServiceActor):
    def __init__(self, bus: Bus, store: Store, clock: Clock, *, batch: int = 1000,
                 sweep_interval: float = 5.0, publish_timeout: float = 10.0) -> None:
        self.bus = bus
        self.store = store
        self.clock = clock
        self.batch = batch
        self.sweep_interval = sweep_interval
        self.publish_timeout = publish_timeout
        self._pending: OrderedDict[int, OutboxRow] = OrderedDict()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self.published = 0

    def _on_rows(self, rows: list[OutboxRow]) -> None:
        for row in rows:
            self._pending[row.id] = row
        self._idle.clear()
        self._wake.set()

    async def on_start(self) -> None:
        self.store.add_outbox_listener(self._on_rows)
        await super().on_start()

    async def on_stop(self) -> None:
        self.store.remove_outbox_listener(self._on_rows)
        await super().on_stop()

    async def serve(self) -> None:
        await self._sweep()
        sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        try:
            while True:
                if not self._pending:
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                await self._publish_some()
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper

    async def _sweep_forever(self) -> None:
        while True:
            await self.clock.sleep(self.sweep_interval)
            await self._sweep()

    async def _sweep(self) -> None:
        rows = await self.store.pending_outbox(limit=100_000)
        fresh = [r for r in rows if r.id not in self._pending]
        if fresh:
            self._on_rows(fresh)
            self._pending = OrderedDict(sorted(self._pending.items()))

    async def _publish_some(self) -> None:
        ids = list(self._pending)[: self.batch]
        rows = [self._pending[i] for i in ids]
        try:
            futures = []
            for row in rows:
                headers = {"Nats-Msg-Id": row.msg_id, **(row.headers or {})}
                futures.append(await self.bus.js.publish_async(row.subject, row.payload,
                                                               headers=headers))
            await asyncio.wait_for(asyncio.gather(*futures), self.publish_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Not published (or not confirmed): keep the rows; republishing is safe.
            log.warning("outbox publish failed; will retry", error=repr(exc), rows=len(rows))
            await self.clock.sleep(0.5)
            return
        await self.store.delete_outbox(ids)
        for i in ids:
            self._pending.pop(i, None)
        self.published += len(ids)

    async def flush(self, timeout: float) -> bool:
        """Wait until everything announced so far is published (used at shutdown)."""
        if not self._pending:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False
