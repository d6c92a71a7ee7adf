"""``ratchet serve``: a node in the foreground, and its flags (docs/operations.md).

Exit status: 0 after a stop asked by SIGINT or SIGTERM (drained within ``--drain-timeout``;
a second signal cuts the drain short), also while it was still starting; 1 when the node
failed while serving; for a refused start (``StartRefused``) the status of its code below,
with one line on stderr that says why and the error as JSON on stdout; 15 (NOT_READY) when
it was not ready within ``--ready-timeout`` (same two lines); 2 for another Ratchet error
that stops the start (e.g. ``SecretUnreadable``, a taken ``--metrics-port``: ``ratchet``'s
own handler). The ``serving`` line is printed once the node is ready.
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
from typing import TYPE_CHECKING, Any

import structlog

from ratchet.actors.effects.risk_policy import ToolRisk, parse_policy
from ratchet.actors.transport import local_nodes
from ratchet.actors.transport.bus import MB, StreamLimits
from ratchet.actors.transport.servers import join_servers
from ratchet.persistence.dead_letter_rows import DeadLetterLimits
from ratchet.protocol.auth import redact_url
from ratchet.protocol.errors import ErrorCode, StartRefused, UsageError
from ratchet.protocol.tracing import enabled as tracing_enabled
from ratchet.supervisors.cli.common import ExitCode, load_app
from ratchet.supervisors.cli.serve_flags import store_location
from ratchet.supervisors.cli.serve_health import (
    observability_for,
    until_ready,
)
from ratchet.supervisors.cli.startup_gc import release as release_gc
from ratchet.supervisors.node.credentials import admin_key_path
from ratchet.supervisors.node.log_output import log_write_failures
from ratchet.supervisors.node.node import Node, NodeConfig
from ratchet.supervisors.node.otel_switch import wanted as tracing_wanted
from ratchet.supervisors.node.startup import StartupPhases
from ratchet.supervisors.observability.health import readiness
from ratchet.supervisors.services.canary import check_routes, parse_routes

if TYPE_CHECKING:
    from ratchet.supervisors.console import Console
    from ratchet.supervisors.observability.http import Observability

log = structlog.get_logger("ratchet.serve")

#: ``ratchet serve``'s exit status for each refused start (docs/operations.md).
REFUSED_START_EXIT = {code: ExitCode[code.value] for code in (
    ErrorCode.NODE_ID_IN_USE, ErrorCode.PARTITION_COUNT_MISMATCH, ErrorCode.STORE_READ_ONLY,
    ErrorCode.NATS_UNREACHABLE, ErrorCode.NATS_PORT_TAKEN,
    ErrorCode.SCHEMA_VERSION_MISMATCH, ErrorCode.STORE_UNREACHABLE,
    ErrorCode.AUDIT_KEY_MISMATCH)}


async def serve(args: argparse.Namespace) -> int:
    startup = StartupPhases()
    startup.mark("imports")
    try:
        return await _observed(args, startup)
    finally:
        release_gc()  # started, refused or interrupted: collect as usual again


async def _observed(args: argparse.Namespace, startup: StartupPhases) -> int:
    registry = load_app(args.app)
    node = Node(node_config(args), registry, startup=startup)
    startup.mark("app")
    check_routes(node.config.new_task_routes, registry)  # a usage error before NATS starts
    observed = observability_for(node)
    if observed is not None:
        await observed.start()  # UsageError (exit 2): the port is taken
    if not tracing_wanted(node.config.otel):  # the SDK is not even imported then
        try:
            return await _serve(node, observed)
        finally:
            if observed is not None:
                await observed.stop()
    # Traces before the node starts (its first spans are the recovery's), flushed after it
    # stopped (supervisors/node/otel.py); off unless --otel or OTEL_* ask for them.
    from ratchet.supervisors.node.otel import start_tracing, stop_tracing

    provider = start_tracing(node.config.otel)
    try:
        return await _serve(node, observed)
    finally:
        stop_tracing(provider)
        if observed is not None:
            await observed.stop()


async def _serve(node: Node, observed: Observability | None) -> int:
    config, loop = node.config, asyncio.get_running_loop()
    deadline = loop.time() + config.ready_timeout
    stop = asyncio.Event()
    with _stop_signals(stop, again=node.hurry):
        starting = asyncio.ensure_future(node.start())
        if not await _first(starting, stop.wait(), asyncio.sleep(config.ready_timeout)):
            starting.cancel()  # a signal (or the bound) while starting: the start undoes itself
            await asyncio.wait([starting])
            if not stop.is_set():
                return _not_ready(config.node_id, config.ready_timeout, "still starting")
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
        if observed is not None:
            observed.watch()
        ready = asyncio.ensure_future(until_ready(node, max(0.0, deadline - loop.time())))
        await _first(ready, stop.wait())
        if not ready.done():
            ready.cancel()  # a signal while waiting to be ready: stop below
        elif not ready.result():
            why = readiness(node).failing() or "failed"
            await node.stop()
            return _not_ready(config.node_id, config.ready_timeout, why)
        if not stop.is_set():
            node.startup.mark("ready")
            release_gc()
            node.startup.log(config.node_id)
            console = await _start_console(node, config)
            _register_local(node, config)
            _say({"serving": config.node_id, "nats_url": redact_url(node.url),
                  "db": config.store_name, "workflows": node.registry.names(),
                  "pid": os.getpid(), "traces": config.otel or tracing_enabled(),
                  **({"metrics": observed.url} if observed else {}),
                  **({"console": console.url} if console else {}),
                  "startup_ms": node.startup.figures()})
            await _first(node.failed.wait(), stop.wait())
            if console is not None:
                await console.stop()
        await node.stop()
        if node.embedded is not None and node.url:
            local_nodes.unregister(node.url, os.getpid())
        _say({"stopped": config.node_id, "failed": node.failed.is_set(),
              **node.writer_summary(), "log_write_failures": log_write_failures()})
    return 1 if node.failed.is_set() else 0


def _register_local(node: Node, config: NodeConfig) -> Path | None:
    """Tell clients of this OS user where the embedded server's key is (local_nodes.py), so
    ``Client.connect(url)`` works without ``creds``. Best effort: a read-only home only
    costs that convenience."""
    if node.embedded is None or not node.url:
        return None
    try:
        return local_nodes.register(node.url, admin_key_path(config.state_dir), os.getpid())
    except OSError as exc:
        log.warning("local node entry not written", error=str(exc))
        return None


async def _start_console(node: Node, config: NodeConfig) -> Console | None:
    """The web console, when ``--console-port`` asks for it (supervisors/console/)."""
    if config.console_port is None:
        return None
    from ratchet.supervisors.console import Console  # only for --console-port

    console = Console.for_node(node, config.console_host, config.console_port)
    try:
        await console.start()
    except OSError as exc:  # the port is taken, the address is not this host's, ...
        await node.stop()
        raise UsageError(f"cannot serve the console on {config.console_host}:"
                         f"{config.console_port}: {exc.strerror or exc}") from None
    return console


def _not_ready(node_id: str, timeout: float, why: str) -> int:
    """``serve``'s refusal when the node was not ready in time: its JSON line, one line on
    stderr, and the status NOT_READY."""
    message = f"not ready within --ready-timeout {timeout:g} s: {why}"
    _say({"error": {"code": "NOT_READY", "message": message, "node": node_id}})
    with contextlib.suppress(OSError):
        print(f"ratchet serve: {message}", file=sys.stderr, flush=True)
    return ExitCode.NOT_READY


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
        nats_url=join_servers(args.nats_url),
        nats_replicas=args.nats_replicas,
        nats_creds=Path(args.nats_creds) if args.nats_creds else None,
        nats_port=args.nats_port,
        nats_connect_timeout=args.nats_connect_timeout,
        drain_timeout=args.drain_timeout,
        synchronous=args.synchronous,
        store=store_location(args.store),
        audit_key_file=Path(args.audit_key_file) if args.audit_key_file else None,
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
        dead_letters=dead_letter_limits(args),
        max_running=args.max_running,
        recovery_interval=args.recovery_interval,
        tenant_quotas=pairs(args.tenant_quota, int),
        tenant_weights=pairs(args.tenant_weight, float),
        risk_policy=risk_policy(args.risk_policy),
        cancel_timeout=args.cancel_timeout,
        settle_after=args.settle_after,
        settle_interval=args.settle_interval,
        submit_rate=args.submit_rate,
        tenant_submit_rates=pairs(args.tenant_submit_rate, float),
        submit_burst=args.submit_burst,
        console_port=args.console_port,
        console_host=args.console_host,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        ready_timeout=args.ready_timeout,
        otel=args.otel,
        new_task_routes=parse_routes(args.route_new_tasks),
    )
    if args.node_id:
        config.node_id = args.node_id
    return config


def dead_letter_limits(args: argparse.Namespace) -> DeadLetterLimits:
    """``--dead-letters-max`` / ``--dead-letters-max-mb``; not positive: a usage error."""
    try:
        return DeadLetterLimits(args.dead_letters_max, int(args.dead_letters_max_mb * MB))
    except ValueError as exc:
        raise UsageError(f"--dead-letters-max/--dead-letters-max-mb: {exc}") from None


def risk_policy(path: str | None) -> dict[str, dict[str, ToolRisk]]:
    """``--risk-policy FILE``: the tenants' tightening of tool tiers, as JSON
    (actors/effects/risk_policy.py); a bad file is a usage error naming the bad part."""
    if not path:
        return {}
    try:
        return parse_policy(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:  # ToolDefinitionError is a ValueError too
        raise UsageError(f"--risk-policy {path}: {exc}") from None
