"""A node's store figures for people: group commits and the WAL (the ``stopped`` line of
``ratchet serve``, bench scripts)."""

from __future__ import annotations

from typing import Any

from ratchet.persistence.ports import StorePort

__all__ = ["store_figures"]


def store_figures(store: StorePort) -> dict[str, Any]:
    """Group-commit figures (batches, transactions, how long batches took), the WAL's, and
    (FULL on the loop writer) its syncs: how many, batches per sync, how long."""
    stats = store.writer_stats
    durations = sorted(stats.commit_seconds)

    def pct(p: float) -> float:
        return round(durations[int(p * (len(durations) - 1))] * 1000, 3) if durations else 0.0

    wal = store.wal_stats
    return {"commit_batches": stats.batches, "commit_transactions": stats.transactions,
            "largest_batch": stats.largest_batch, "commit_p50_ms": pct(0.5),
            "commit_p99_ms": pct(0.99), "commit_max_ms": pct(1.0),
            "wal_peak_mb": round(wal.wal_peak_bytes / 1e6, 2), "wal_restarts": wal.restarts,
            "wal_restart_failures": wal.restart_failures,
            "wal_hold_max_ms": round(wal.hold_max_seconds * 1000, 2), **stats.sync_summary()}
