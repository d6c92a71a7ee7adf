"""``ratchet serve``: a node in the foreground, and its flags (docs/operations.md).

Exit status: 0 after a stop asked by SIGINT or SIGTERM (drained within ``--drain-timeout``;
a second signal cuts the drain short), also while it was still starting; 1 when the node
failed while serving; for a refused start (``StartRefused``) the status of its code below,
with one line on stderr that says why and the error as JSON on stdout; 2 for another
Ratchet error that stops the start (e.g. ``SecretUnreadable``: ``ratchet``'s own handler).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from ratchet.actors.effects.risk_policy import ToolRisk, parse_policy
from ratchet.actors.transport.bus import MB, StreamLimits
from ratchet.protocol.auth import redact_url
from ratchet.protocol.errors import ErrorCode, StartRefused, UsageError
from ratchet.protocol.tracing import enabled as tracing_enabled
from ratchet.supervisors.cli.common import ExitCode, load_app
from ratchet.supervisors.node.log_output import log_write_failures
from ratchet.supervisors.node.node import Node, NodeConfig
from ratchet.supervisors.node.otel import start_tracing, stop_tracing

#: ``ratchet serve``'s exit status for each refused start (docs/operations.md).
REFUSED_START_EXIT = {code: ExitCode[code.value] for code in (
    ErrorCode.NODE_ID_IN_USE, ErrorCode.PARTITION_COUNT_MISMATCH, ErrorCode.STORE_READ_ONLY,
    ErrorCode.NATS_UNREACHABLE, ErrorCode.NATS_PORT_TAKEN)}


async def serve(args: argparse.Namespace) -> int:
    registry = load_app(args.app)
    config = node_config(args)
    node = Node(config, registry)
    stop = asyncio.Event()
    # Traces before the node starts (its first spans are the recovery's), flushed after it
    # stopped (supervisors/node/otel.py); off unless --otel or OTEL_* ask for them.
    provider = start_tracing(config.otel)
    try:
        return await _serve(node, config, registry.names(), stop)
    finally:
        stop_tracing(provider)


async def _serve(node: Node, config: NodeConfig, workflows: list[str],
                 stop: asyncio.Event) -> int:
    with _stop_signals(stop, again=node.hurry):
        starting = asyncio.ensure_future(node.start())
        if not await _first(starting, stop.wait()):
            starting.cancel()  # a signal while starting: the start undoes itself
            await asyncio.wait([starting])
            _say({"stopped": config.node_id, "while": "starting"})
            return 0
        try:
            starting.result()
        except StartRefused as exc:
            _say({"error": exc.to_wire()})
            with contextlib.suppress(OSError):  # stderr gone too: the status still says it
                print(f"ratchet serve: {exc.message} ({exc.code.value})", file=sys.stderr,
                      flush=True)
            return REFUSED_START_EXIT[exc.code]
        _say({"serving": config.node_id, "nats_url": redact_url(node.url),
              "db": str(config.db_path), "workflows": workflows, "pid": os.getpid(),
              "traces": config.otel or tracing_enabled()})
        await _first(node.failed.wait(), stop.wait())
        await node.stop()
        _say({"stopped": config.node_id, "failed": node.failed.is_set(),
              **node.writer_summary(), "log_write_failures": log_write_failures()})
    return 1 if node.failed.is_set() else 0


async def _first(*waits: Awaitable[Any]) -> bool:
    """Wait until one of ``waits`` is done; True if the first was. The ones still pending
    that were coroutines are cancelled; a future passed in is left to its owner."""
    futures = [asyncio.ensure_future(w) for w in waits]
    done, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    for given, fut in zip(waits, futures, strict=True):
        if fut in pending and fut is not given:
            fut.cancel()
    return futures[0] in done


@contextlib.contextmanager
def _stop_signals(stop: asyncio.Event, again: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop``; a second one calls ``again`` (cut the drain)."""
    loop = asyncio.get_running_loop()

    def received() -> None:
        if stop.is_set():
            again()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, received)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _say(obj: dict[str, Any]) -> None:
    """One JSON line on stdout, best effort: a reader that went away (``serve | tee`` and
    a Ctrl-C, which stops tee too) must not stop the node from stopping cleanly."""
    try:
        print(json.dumps(obj, default=str), flush=True)
    except (BrokenPipeError, ValueError):
        # Python would fail again flushing stdout at exit: point it at /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def node_config(args: argparse.Namespace) -> NodeConfig:
    """The NodeConfig the flags describe."""

    def pairs(items: list[str], kind: type) -> dict[str, Any]:
        out = {}
        for item in items:
            tenant, _, value = item.partition("=")
            out[tenant] = kind(value)
        return out

    config = NodeConfig(
        state_dir=Path(args.state_dir),
        nats_url=args.nats_url,
        nats_creds=Path(args.nats_creds) if args.nats_creds else None,
        nats_port=args.nats_port,
        nats_connect_timeout=args.nats_connect_timeout,
        drain_timeout=args.drain_timeout,
        synchronous=args.synchronous,
        partitions=args.partitions,
        retention=pairs(args.retention, float),
        lease_ttl=args.lease_ttl,
        lease_interval=args.lease_interval,
        writer=args.writer,
        clock_step_threshold=args.clock_step_threshold,
        clock_step_hold=args.clock_step_hold,
        wal_limit_mb=args.wal_limit_mb,
        max_value_mb=args.max_value_mb,
        max_checkpoint_mb=args.max_checkpoint_mb,
        streams=StreamLimits(
            events_max_bytes=int(args.events_max_mb * MB), dlq_max_bytes=int(args.dlq_max_mb * MB)
        ),
        max_running=args.max_running,
        recovery_interval=args.recovery_interval,
        tenant_quotas=pairs(args.tenant_quota, int),
        tenant_weights=pairs(args.tenant_weight, float),
        risk_policy=risk_policy(args.risk_policy),
        submit_rate=args.submit_rate,
        tenant_submit_rates=pairs(args.tenant_submit_rate, float),
        submit_burst=args.submit_burst,
        otel=args.otel,
    )
    if args.node_id:
        config.node_id = args.node_id
    return config


def risk_policy(path: str | None) -> dict[str, dict[str, ToolRisk]]:
    """``--risk-policy FILE``: the tenants' tightening of tool tiers, as JSON
    (actors/effects/risk_policy.py); a bad file is a usage error naming the bad part."""
    if not path:
        return {}
    try:
        return parse_policy(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:  # ToolDefinitionError is a ValueError too
        raise UsageError(f"--risk-policy {path}: {exc}") from None


def risk_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--risk-policy", default=None, metavar="FILE", help="JSON: per tenant"
                   " and tool, tighten risk tiers (requires_approval, max_amount)")


def clock_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--clock-step-threshold",
        type=float,
        default=5.0,
        help="seconds the wall clock may jump against the steady clock before it counts as a step",
    )
    s.add_argument(
        "--clock-step-hold",
        type=float,
        default=600.0,
        help="seconds after a forward step before the timers it made due fire"
        " (sooner with `admin clock-ack`); 0: never hold",
    )


def nats_flags(s: argparse.ArgumentParser) -> None:
    """Where the node finds NATS, how long it tries, and how long it drains at a stop."""
    s.add_argument("--nats-url", default=None, help="join this NATS instead of the embedded one")
    s.add_argument(
        "--nats-creds",
        default=None,
        metavar="FILE",
        help="the node's credentials for --nats-url: an nkey seed (e.g. the state"
        " dir's keys/node.nk) or a NATS .creds file",
    )
    s.add_argument(
        "--nats-port",
        type=int,
        default=None,
        help="the embedded nats-server's port (default: the one kept in"
        " <state-dir>/nats/nats.port, first picked free)",
    )
    s.add_argument(
        "--nats-connect-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up starting when NATS does not answer within this long",
    )
    s.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, wait this long at most for tasks to reach a safe point",
    )


def serve_flags(s: argparse.ArgumentParser) -> None:
    """The flags of `ratchet serve` (each sets a NodeConfig field; docs/operations.md)."""
    s.add_argument("--app", required=True, help="module:object registering workflows")
    nats_flags(s)
    s.add_argument("--synchronous", default="NORMAL", choices=["NORMAL", "FULL"])
    s.add_argument("--partitions", type=int, default=16)
    s.add_argument("--node-id", default=None)
    s.add_argument("--retention", action="append", default=[], metavar="TENANT=SECONDS",
                   help="keep finished tasks this long (TENANT '*' for every other tenant)")
    s.add_argument("--lease-ttl", type=float, default=5.0,
                   help="seconds a partition lease lasts unrenewed (bounds failover)")
    s.add_argument(
        "--lease-interval",
        type=float,
        default=1.0,
        help="seconds between heartbeats (renewal, rebalancing, reaping)",
    )
    clock_flags(s)
    s.add_argument(
        "--writer",
        default="auto",
        choices=["auto", "loop", "thread"],
        help="where commits run; 'thread' when several nodes share the store",
    )
    s.add_argument(
        "--wal-limit-mb",
        type=float,
        default=32.0,
        help="WAL size at which writes pause (milliseconds) while it is reset",
    )
    for flag, mb in (("--max-value-mb", 16.0), ("--max-checkpoint-mb", 64.0)):  # state bounds
        s.add_argument(flag, type=float, default=mb, help=f"most MiB of state per {flag[6:-3]}")
    s.add_argument(
        "--events-max-mb",
        type=float,
        default=1024.0,
        help="JetStream events stream size; the oldest events go beyond it",
    )
    s.add_argument(
        "--dlq-max-mb",
        type=float,
        default=256.0,
        help="dead-letter stream size; the oldest dead letters go beyond it",
    )
    s.add_argument(
        "--max-running",
        type=int,
        default=64,
        help="tasks this node runs at once; more wait their (fair) turn",
    )
    s.add_argument(
        "--recovery-interval",
        type=float,
        default=30.0,
        help="seconds between sweeps for unfinished tasks whose mail was lost",
    )
    s.add_argument(
        "--tenant-quota",
        action="append",
        default=[],
        metavar="TENANT=N",
        help="at most N running tasks of TENANT on this node",
    )
    s.add_argument(
        "--tenant-weight",
        action="append",
        default=[],
        metavar="TENANT=W",
        help="TENANT's share of the running slots relative to others (default 1)",
    )
    risk_flags(s)
    submit_rate_flags(s)
    s.add_argument(
        "--otel",
        action="store_true",
        help="OpenTelemetry traces to the OTLP exporter the OTEL_* variables configure"
        " (also on when OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT is set)",
    )


def submit_rate_flags(s: argparse.ArgumentParser) -> None:
    """Per-tenant submit rate limits at intake (supervisors/services/rate_limits.py)."""
    s.add_argument(
        "--submit-rate",
        type=float,
        default=None,
        metavar="R",
        help="each tenant submits at most R tasks a second to this node (else RATE_LIMITED)",
    )
    s.add_argument(
        "--tenant-submit-rate",
        action="append",
        default=[],
        metavar="TENANT=R",
        help="TENANT's submit rate, overriding --submit-rate",
    )
    s.add_argument(
        "--submit-burst",
        type=int,
        default=None,
        metavar="N",
        help="submissions a tenant may make at once (default: one second's worth)",
    )
