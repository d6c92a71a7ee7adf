"""Soak: one node under a steady submission rate for minutes. Prints one JSON line.

    python bench/soak.py [--rate 150] [--seconds 600] [--synchronous FULL|NORMAL]

A real ``ratchet serve`` subprocess with its defaults (embedded nats-server, SQLite in WAL
mode) serves the five-step ``five`` workflow; this process publishes ``rate`` submissions
a second, paced against the clock, and follows the terminal events on one subscription.
Every ``sample`` seconds it reads the node's RSS and the store's files.

Figures: ``tasks_done``; ``lost_tasks`` (submitted, not terminal 120 s after the last
submission); ``wal_peak_mb`` (the larger of the sampled WAL file and the node's own peak,
which it checks after every commit); ``db_mb_per_1k_tasks``; ``rss_growth_mb`` (mean RSS
of the last window minus that of the first window after warm-up; a window is a minute, or
half of what follows the warm-up in a shorter run). The warm-up is 120 s by default: the
node's bounded windows (the mail routers' recent message ids, 120 s; the stream's
duplicate window) and its allocator's pools fill over the first two minutes, and that
filling is not growth; ``rss_growth_after_30s_mb`` reports the same from 30 s on; ``p99_first_min_ms`` and
``p99_last_min_ms`` (submit → terminal event of the tasks that finished in those windows);
``jetstream_mb`` (the embedded server's store at the end); ``rss_peak_mb`` (the node's
``VmHWM`` before it stops); the node's WAL restarts and longest writer hold.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.steps import NodeProc, percentile, publish_submit
from ratchet.protocol.codec import decode_map
from ratchet.protocol.ids import task_id_for

TENANT = "soak"
TERMINAL = ("task.succeeded", "task.failed", "task.cancelled")


@dataclass
class Sample:
    t: float
    rss_mb: float
    wal_mb: float
    db_mb: float


@dataclass
class Tally:
    sent: dict[str, float] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)  # task id → terminal seen at
    failed: set[str] = field(default_factory=set)
    samples: list[Sample] = field(default_factory=list)
    submitting: bool = True
    all_done: asyncio.Event = field(default_factory=asyncio.Event)

    def check_done(self) -> None:
        if not self.submitting and len(self.done) >= len(self.sent):
            self.all_done.set()

    def p99_ms(self, lo: float, hi: float) -> float | None:
        lat = [(at - self.sent[t]) * 1000 for t, at in self.done.items()
               if lo <= at < hi and t in self.sent]
        return round(percentile(lat, 0.99), 1) if lat else None

    def mean_rss(self, lo: float, hi: float) -> float:
        return statistics.fmean(s.rss_mb for s in self.samples if lo <= s.t < hi)


def _file_mb(path: Path) -> float:
    try:
        return path.stat().st_size / 1e6
    except FileNotFoundError:
        return 0.0


def _dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


async def _follow(client: ratchet.Client, tally: Tally) -> None:
    async def on_event(msg: Any) -> None:
        event = decode_map(msg.data)
        tally.done.setdefault(event["task_id"], time.time())
        if event["type"] != "task.succeeded":
            tally.failed.add(event["task_id"])
        tally.check_done()

    for kind in TERMINAL:
        await client.nc.subscribe(f"ratchet.events.{TENANT}.*.{kind}", cb=on_event)
    await client.nc.flush()


def _report_window(tally: Tally, now: float) -> None:
    """The last ten seconds, on stderr (stdout keeps the one JSON line)."""
    s = tally.samples[-1]
    print(json.dumps({"t": round(now - tally.samples[0].t), "done": len(tally.done),
                      "p99_ms": tally.p99_ms(now - 10, now), "rss_mb": round(s.rss_mb, 1),
                      "wal_mb": round(s.wal_mb, 1), "db_mb": round(s.db_mb, 1)}),
          file=sys.stderr, flush=True)


async def _drive(client: ratchet.Client, node: NodeProc, tally: Tally, rate: float,
                 seconds: float, sample_every: float) -> None:
    db = node.state_dir / "ratchet.db"
    wal = node.state_dir / "ratchet.db-wal"
    run = time.time_ns()
    t0 = time.time()
    next_sample, k, acks = t0, 0, []
    while (now := time.time()) - t0 < seconds:
        while k < int((now - t0) * rate):
            key = f"soak-{run}-{k}"
            tally.sent[task_id_for(TENANT, key)] = time.time()
            acks.append(await publish_submit(client, "five", key))
            k += 1
        if now >= next_sample:
            tally.samples.append(Sample(now, node.status("VmRSS") / 1024, _file_mb(wal),
                                        _file_mb(db)))
            next_sample += sample_every
            if len(tally.samples) % 10 == 0:
                _report_window(tally, now)
        if len(acks) > 1000:
            await asyncio.gather(*acks)  # a refused publish fails the run
            acks = []
        await asyncio.sleep(0.002)
    await asyncio.gather(*acks)


async def run_soak(rate: float = 150.0, seconds: float = 600.0, synchronous: str = "FULL",
                   warmup: float = 120.0, sample_every: float = 1.0,
                   drain_timeout: float = 120.0, serve_args: tuple[str, ...] = ()
                   ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ratchet-soak-") as tmp:
        node = NodeProc(Path(tmp) / "state", None, synchronous=synchronous, args=serve_args,
                        log_path=Path(tmp) / "node.log")
        node.start()
        tally = Tally()
        try:
            assert node.url is not None
            client = await ratchet.Client.connect(node.url, TENANT, creds=node.creds)
            await _follow(client, tally)
            t0 = time.time()
            await _drive(client, node, tally, rate, seconds, sample_every)
            tally.submitting = False
            tally.check_done()
            with contextlib.suppress(TimeoutError):  # what is still missing is lost
                await asyncio.wait_for(tally.all_done.wait(), drain_timeout)
            jetstream_mb = _dir_mb(node.state_dir / "nats")
            db_mb = _file_mb(node.state_dir / "ratchet.db")
            rss_peak_mb = node.status("VmHWM") / 1024
            await client.close()
        finally:
            closing = node.stop()
    window = min(60.0, (seconds - warmup) / 2)
    first = (t0 + warmup, t0 + warmup + window)
    last = (t0 + seconds - window, t0 + seconds)
    sampled_wal = max((s.wal_mb for s in tally.samples), default=0.0)
    return {
        "rate_per_s": rate, "seconds": seconds, "synchronous": synchronous,
        "tasks_submitted": len(tally.sent), "tasks_done": len(tally.done),
        "tasks_not_succeeded": len(tally.failed),
        "lost_tasks": len(set(tally.sent) - set(tally.done)),
        "wal_peak_mb": round(max(sampled_wal, closing.get("wal_peak_mb", 0.0)), 1),
        "wal_restarts": closing.get("wal_restarts"),
        "wal_restart_failures": closing.get("wal_restart_failures"),
        "wal_hold_max_ms": closing.get("wal_hold_max_ms"),
        "db_mb_per_1k_tasks": round(db_mb / max(1, len(tally.done)) * 1000, 2),
        "jetstream_mb": round(jetstream_mb, 1),
        "rss_first_min_mb": round(tally.mean_rss(*first), 1),
        "rss_last_min_mb": round(tally.mean_rss(*last), 1),
        "rss_growth_mb": round(tally.mean_rss(*last) - tally.mean_rss(*first), 1),
        # The same from 30 s on, for comparison with earlier runs (it includes the filling
        # of the bounded windows and pools).
        "rss_growth_after_30s_mb": round(
            tally.mean_rss(*last) - tally.mean_rss(t0 + 30.0, t0 + 30.0 + window), 1),
        "rss_peak_mb": round(rss_peak_mb, 1),
        "p99_first_min_ms": tally.p99_ms(*first), "p99_last_min_ms": tally.p99_ms(*last),
        # Every minute after warm-up: a trend shows here, one stall in a minute does too.
        "p99_by_min_ms": [tally.p99_ms(t, t + 60) for t in
                          _minutes(t0 + warmup, t0 + seconds)],
        "commit_p99_ms": closing.get("commit_p99_ms"),
    }


def _minutes(start: float, end: float) -> list[float]:
    return [start + 60 * i for i in range(int((end - start) // 60))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=150.0, help="submissions per second")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--synchronous", default="FULL", choices=["NORMAL", "FULL"],
                    help="the store setting (default FULL, the node's default)")
    ap.add_argument("--warmup", type=float, default=120.0,
                    help="seconds before the first window: the 120 s windows must fill first")
    ap.add_argument("--serve-args", default="", help="extra `serve` flags, e.g. '--wal-limit-mb 32'")
    a = ap.parse_args()
    print(json.dumps(asyncio.run(run_soak(a.rate, a.seconds, a.synchronous, a.warmup,
                                          serve_args=tuple(a.serve_args.split())))))


if __name__ == "__main__":
    main()
