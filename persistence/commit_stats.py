"""What both SQLite writers share: their figures (commit latency histogram, batch sizes)
and how results reach the futures of the callers, on their loop."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COMMIT_BUCKETS", "WriterStats", "call_soon_threadsafe", "settle"]


#: Upper bounds (seconds) of the commit latency histogram's buckets.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class WriterStats:
    batches: int = 0
    transactions: int = 0
    largest_batch: int = 0
    commit_seconds: list[float] = field(default_factory=list)  # last 10,000 batch durations
    #: Every batch's duration since the start, by COMMIT_BUCKETS (the last one: above them),
    #: and their sum: the commit latency histogram of a metrics scrape.
    commit_buckets: list[int] = field(default_factory=lambda: [0] * (len(COMMIT_BUCKETS) + 1))
    commit_sum: float = 0.0
    #: FULL on the loop writer: the WAL syncs (persistence/syncer.py), written by its thread.
    syncs: int = 0
    sync_seconds: float = 0.0
    sync_max_seconds: float = 0.0
    batches_synced: int = 0  # batches made durable; / syncs = the group commit's fan-in

    def record_sync(self, batches: int, seconds: float) -> None:
        self.syncs += 1
        self.batches_synced += batches
        self.sync_seconds += seconds
        self.sync_max_seconds = max(self.sync_max_seconds, seconds)

    def sync_summary(self) -> dict[str, Any]:
        """The syncs' figures for a log line (empty without syncs)."""
        if not self.syncs:
            return {}
        return {"syncs": self.syncs,
                "batches_per_sync": round(self.batches_synced / self.syncs, 2),
                "sync_avg_ms": round(self.sync_seconds / self.syncs * 1000, 3),
                "sync_max_ms": round(self.sync_max_seconds * 1000, 3)}

    def record(self, size: int, seconds: float) -> None:
        self.batches += 1
        self.transactions += size
        self.largest_batch = max(self.largest_batch, size)
        self.commit_buckets[bisect.bisect_left(COMMIT_BUCKETS, seconds)] += 1
        self.commit_sum += seconds
        if len(self.commit_seconds) >= 10_000:
            del self.commit_seconds[:5_000]
        self.commit_seconds.append(seconds)


def settle(settled: list[tuple[asyncio.Future[Any], tuple[bool, Any]]]) -> None:
    for fut, (ok, value) in settled:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def call_soon_threadsafe(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any],
                          *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed meanwhile: nobody is waiting
        pass
