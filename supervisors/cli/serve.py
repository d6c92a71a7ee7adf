"""``ratchet serve``: a node in the foreground, and its flags (docs/operations.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from ratchet.actors.transport.bus import MB, StreamLimits
from ratchet.protocol.auth import redact_url
from ratchet.supervisors.cli.common import emit, load_app
from ratchet.supervisors.node.log_output import log_write_failures
from ratchet.supervisors.node.node import Node, NodeConfig


async def serve(args: argparse.Namespace) -> int:
    registry = load_app(args.app)

    def pairs(items: list[str], kind: type) -> dict[str, Any]:
        out = {}
        for item in items:
            tenant, _, value = item.partition("=")
            out[tenant] = kind(value)
        return out

    config = NodeConfig(state_dir=Path(args.state_dir), nats_url=args.nats_url,
                        nats_creds=Path(args.nats_creds) if args.nats_creds else None,
                        synchronous=args.synchronous, partitions=args.partitions,
                        retention=pairs(args.retention, float), lease_ttl=args.lease_ttl,
                        lease_interval=args.lease_interval, writer=args.writer,
                        clock_step_threshold=args.clock_step_threshold,
                        clock_step_hold=args.clock_step_hold,
                        wal_limit_mb=args.wal_limit_mb, max_value_mb=args.max_value_mb,
                        max_checkpoint_mb=args.max_checkpoint_mb,
                        streams=StreamLimits(events_max_bytes=int(args.events_max_mb * MB),
                                             dlq_max_bytes=int(args.dlq_max_mb * MB)),
                        max_running=args.max_running, recovery_interval=args.recovery_interval,
                        tenant_quotas=pairs(args.tenant_quota, int),
                        tenant_weights=pairs(args.tenant_weight, float))
    if args.node_id:
        config.node_id = args.node_id
    node = Node(config, registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await node.start()
    emit({"serving": config.node_id, "nats_url": redact_url(node.url), "db": str(config.db_path),
            "workflows": registry.names(), "pid": os.getpid()})
    failed = asyncio.ensure_future(node.failed.wait())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([failed, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        failed.cancel()
        stopped.cancel()
        await node.stop()
        emit({"stopped": config.node_id, "failed": node.failed.is_set(),
                **node.writer_summary(), "log_write_failures": log_write_failures()})
    return 1 if node.failed.is_set() else 0


def clock_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--clock-step-threshold", type=float, default=5.0,
                   help="seconds the wall clock may jump against the steady clock before it"
                        " counts as a step")
    s.add_argument("--clock-step-hold", type=float, default=600.0,
                   help="seconds after a forward step before the timers it made due fire"
                        " (sooner with `admin clock-ack`); 0: never hold")


def serve_flags(s: argparse.ArgumentParser) -> None:
    """The flags of `ratchet serve` (each sets a NodeConfig field; docs/operations.md)."""
    s.add_argument("--app", required=True, help="module:object registering workflows")
    s.add_argument("--nats-url", default=None, help="join this NATS instead of the embedded one")
    s.add_argument("--nats-creds", default=None, metavar="FILE",
                   help="the node's credentials for --nats-url: an nkey seed (e.g. the state"
                        " dir's keys/node.nk) or a NATS .creds file")
    s.add_argument("--synchronous", default="NORMAL", choices=["NORMAL", "FULL"])
    s.add_argument("--partitions", type=int, default=16)
    s.add_argument("--node-id", default=None)
    s.add_argument("--retention", action="append", default=[], metavar="TENANT=SECONDS",
                   help="keep finished tasks this long (TENANT '*' for every other tenant)")
    s.add_argument("--lease-ttl", type=float, default=5.0,
                   help="seconds a partition lease lasts unrenewed (bounds failover)")
    s.add_argument("--lease-interval", type=float, default=1.0,
                   help="seconds between heartbeats (renewal, rebalancing, reaping)")
    clock_flags(s)
    s.add_argument("--writer", default="auto", choices=["auto", "loop", "thread"],
                   help="where commits run; 'thread' when several nodes share the store")
    s.add_argument("--wal-limit-mb", type=float, default=32.0,
                   help="WAL size at which writes pause (milliseconds) while it is reset")
    for flag, mb in (("--max-value-mb", 16.0), ("--max-checkpoint-mb", 64.0)):  # state bounds
        s.add_argument(flag, type=float, default=mb, help=f"most MiB of state per {flag[6:-3]}")
    s.add_argument("--events-max-mb", type=float, default=1024.0,
                   help="JetStream events stream size; the oldest events go beyond it")
    s.add_argument("--dlq-max-mb", type=float, default=256.0,
                   help="dead-letter stream size; the oldest dead letters go beyond it")
    s.add_argument("--max-running", type=int, default=64,
                   help="tasks this node runs at once; more wait their (fair) turn")
    s.add_argument("--recovery-interval", type=float, default=30.0,
                   help="seconds between sweeps for unfinished tasks whose mail was lost")
    s.add_argument("--tenant-quota", action="append", default=[], metavar="TENANT=N",
                   help="at most N running tasks of TENANT on this node")
    s.add_argument("--tenant-weight", action="append", default=[], metavar="TENANT=W",
                   help="TENANT's share of the running slots relative to others (default 1)")
