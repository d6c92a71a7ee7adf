"""The outbox relay: publishes what the Store committed to the outbox, then deletes it.

Rows arrive two ways: announced by the Store right after each commit (the fast path, no
query), and by scanning the table at start and every ``sweep_interval`` (whatever a crash
or a failed publish left behind). Each row is published with ``Nats-Msg-Id`` = its
message id, so a row published twice (a crash between publish and delete) is dropped by
JetStream's duplicate window; subscribers also dedupe events by ``sequence``.
Rows are published in id order per batch, so a task's events keep their order.
Deleting published rows is batched (every ``delete_interval`` or ``delete_batch`` rows):
it keeps a second write off every step's path; a crash before the delete only republishes
rows JetStream (within its window) or subscribers (by sequence) drop.

Actor mail (``ratchet.mail.…``) leaves sealed with the cluster's mail key
(protocol/mail_seal.py): the mail routers drop mail without the seal.

Memory is bounded: at most ``max_pending`` rows wait here (NATS slow or down). Beyond that
announced rows are left in the table and ignored until the relay has caught up; it then
reads them back in id order, so no task's events are ever published out of order.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import structlog
from nats.errors import MaxPayloadError

from ratchet.actors.core.actor import ServiceActor
from ratchet.actors.transport.bus import STREAM_GONE, Bus
from ratchet.actors.transport.js_acks import JsAcks
from ratchet.persistence.ports import OutboxStore
from ratchet.persistence.txns import OutboxRow
from ratchet.protocol.clock import Clock
from ratchet.protocol.mail_seal import MailSeal, is_sealed_subject

__all__ = ["OutboxRelay"]

log = structlog.get_logger("ratchet.outbox")


class OutboxRelay(ServiceActor):
    def __init__(self, bus: Bus, store: OutboxStore, clock: Clock, seal: MailSeal, *,
                 batch: int = 1000, sweep_interval: float = 5.0, publish_timeout: float = 10.0,
                 delete_interval: float = 0.2, delete_batch: int = 2000,
                 linger: float = 0.0, max_pending: int = 20_000) -> None:
        self.bus = bus
        self.store = store
        self.clock = clock
        self.seal = seal
        self.batch = batch
        self.sweep_interval = sweep_interval
        self.publish_timeout = publish_timeout
        self.linger = linger
        self.delete_interval = delete_interval
        self.delete_batch = delete_batch
        self._published_ids: list[int] = []
        self._delete_due: float | None = None
        self._pending: OrderedDict[int, OutboxRow] = OrderedDict()
        self.max_pending = max_pending
        self._overflow = False  # rows beyond max_pending wait in the table, not here
        self.overflows = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self.published = 0
        self._next_sweep = 0.0
        self._publisher: JsAcks | None = None

    def _acks(self) -> JsAcks:
        """The publisher of the bus's current connection (actors/transport/js_acks.py)."""
        if self._publisher is None or self._publisher.nc is not self.bus.nc:
            self._publisher = JsAcks(self.bus.nc)
        return self._publisher

    def _on_rows(self, rows: list[OutboxRow]) -> None:
        if self._overflow:
            return  # read back from the table, in order, once the relay caught up
        if len(self._pending) + len(rows) > self.max_pending:
            self._overflow = True
            self.overflows += 1
            log.warning("outbox relay behind; rows wait in the table", pending=len(self._pending))
        else:
            for row in rows:
                self._pending[row.id] = row
        self._idle.clear()
        self._wake.set()

    def _read_back(self) -> None:
        """Rows may have committed unannounced (the store cannot vouch for some commits):
        take no announcement until the table is read back, in id order."""
        self._overflow = True
        self._idle.clear()
        self._wake.set()

    async def on_start(self) -> None:
        self.store.add_outbox_listener(self._on_rows)
        self.store.add_outbox_resync(self._read_back)
        await super().on_start()

    async def on_stop(self) -> None:
        self.store.remove_outbox_listener(self._on_rows)
        await super().on_stop()
        try:
            await self.delete_published()
        except Exception as exc:  # the store may be closing; the rows are republished later
            log.warning("outbox delete at stop failed", error=repr(exc))

    async def serve(self) -> None:
        await self._sweep()
        async with asyncio.TaskGroup() as children:  # the sweeper stops with the relay
            children.create_task(self._sweep_forever())
            while True:
                if not self._pending and self._overflow:
                    await self._sweep()  # caught up: read what waited in the table
                    continue
                if not self._pending:
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    if self.linger:
                        # Let a few more commits arrive: one socket write and one ack wait
                        # per batch instead of per event. Loop time, not the task clock:
                        # this batches I/O, it is not a timer of the task. Off by default:
                        # rows announced in one loop iteration (a writer batch, a WAL
                        # sync's group) are published together anyway, and a linger is
                        # paid on every hop of a chain (a task's start mail, each event).
                        await asyncio.sleep(self.linger)
                await self._publish_some()

    async def _sweep_forever(self) -> None:
        while True:
            await self.clock.sleep(min(self.sweep_interval, self.delete_interval))
            await self.delete_published()
            if self.clock.monotonic() >= self._next_sweep:
                await self._sweep()

    async def _sweep(self) -> None:
        self._next_sweep = self.clock.monotonic() + self.sweep_interval
        self._overflow = False  # rows announced from now on are kept (merged below)
        room = max(1, self.max_pending - len(self._pending))
        rows = await self.store.pending_outbox(limit=room)
        published = set(self._published_ids)
        fresh = [r for r in rows if r.id not in self._pending and r.id not in published]
        for row in fresh:
            self._pending[row.id] = row
        self._pending = OrderedDict(sorted(self._pending.items()))
        if len(rows) == room:
            # More may wait in the table: keep nothing newer than what was read, or a
            # newer event of a task could be published before an older one.
            last = rows[-1].id
            self._pending = OrderedDict((i, r) for i, r in self._pending.items() if i <= last)
            self._overflow = True
        if self._pending:
            self._idle.clear()
            self._wake.set()

    async def _publish_some(self) -> None:
        ids = list(self._pending)[: self.batch]
        rows = [self._pending[i] for i in ids]
        try:
            futures = []
            for row in list(rows):
                headers = {"Nats-Msg-Id": row.msg_id, **(row.headers or {})}
                if is_sealed_subject(row.subject):
                    headers.update(self.seal.headers(row.subject, row.payload))
                try:
                    futures.append(await self._acks().publish(row.subject, row.payload,
                                                              headers=headers))
                except MaxPayloadError:
                    # This row can never be published: drop it from the batch (the store
                    # keeps events whole) instead of stalling every task behind it.
                    log.error("outbox row too large for NATS; dropped from the stream",
                              subject=row.subject, bytes=len(row.payload))
                    rows.remove(row)
                    await self.store.delete_outbox([row.id])
                    self._pending.pop(row.id, None)
                    ids.remove(row.id)
            await asyncio.wait_for(asyncio.gather(*futures), self.publish_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Not published (or not confirmed): keep the rows; republishing is safe.
            log.warning("outbox publish failed; will retry", error=repr(exc), rows=len(rows))
            if isinstance(exc, STREAM_GONE):  # a stream was deleted: create it again
                await self.bus.restore_streams(exc)
            await self.clock.sleep(0.5)
            return
        for i in ids:
            self._pending.pop(i, None)
        self.published += len(ids)
        self._published_ids.extend(ids)
        now = self.clock.monotonic()
        if self._delete_due is None:
            self._delete_due = now + self.delete_interval
        if len(self._published_ids) >= self.delete_batch or now >= self._delete_due:
            await self.delete_published()

    async def delete_published(self) -> None:
        """Remove published rows from the outbox (batched; also run by the sweeper)."""
        ids, self._published_ids, self._delete_due = self._published_ids, [], None
        if ids:
            await self.store.delete_outbox(ids)

    async def flush(self, timeout: float) -> bool:
        """Wait until everything announced so far is published (used at shutdown)."""
        if not self._pending and not self._overflow:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False
