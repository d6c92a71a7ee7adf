"""Moving the audit chain's head forward off the request path.

Each audit commit has a newer head to write (persistence/audit_seal.py: a locked file
replace on a thread). Written inline, twice per admin command, it doubled the command's
latency (admin ``get`` p50 1.5 → 2.9 ms); written in the background at once, the threads
still competed with the next command. So the newest head is written at most every
``INTERVAL`` seconds: heads that arrive meanwhile coalesce into the newest, and
:meth:`HeadWriter.flush` writes it at once (the store's close and ``verify_audit`` call
it). The head may thus lag the table by up to ``INTERVAL``: entries that recent are
protected by their MACs and the chain, not yet by the head. A crash before the write leaves the head
behind the table, which verification accepts: the entries after a head must chain with
valid MACs, and they do. A head ahead of the table is what it refuses, and that cannot
happen: a head is only queued after its entry committed."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from ratchet.persistence.audit_seal import AuditHead, AuditSeal

__all__ = ["HeadWriter"]

log = structlog.get_logger("ratchet.audit")

#: Seconds a committed head may wait for the next write of the head file.
INTERVAL = 0.2


class HeadWriter:
    def __init__(self, seal: AuditSeal | None) -> None:
        self.seal = seal
        self._pending: AuditHead | None = None
        self._task: asyncio.Task[None] | None = None
        self._now: asyncio.Event | None = None  # set by flush: write without waiting

    def advance(self, head: AuditHead) -> None:
        """Queue ``head`` (committed already) to be written; returns at once."""
        if self.seal is None:
            return
        if self._pending is None or head.seq > self._pending.seq:
            self._pending = head
        if self._task is None or self._task.done():
            self._now = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._write(self._now))

    async def _write(self, now: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):  # heads of the next INTERVAL coalesce
            await asyncio.wait_for(now.wait(), INTERVAL)
        while self._pending is not None and self.seal is not None:
            head, self._pending = self._pending, None
            try:
                await asyncio.to_thread(self.seal.advance, head)
            except OSError as exc:  # a full disk: the next head tries again
                log.warning("audit head not written", seq=head.seq, error=repr(exc))

    async def flush(self) -> None:
        """Wait until every queued head is written."""
        while self._task is not None and not self._task.done():
            if self._now is not None:
                self._now.set()
            await asyncio.shield(self._task)
