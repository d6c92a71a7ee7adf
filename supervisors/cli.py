"""``ratchet`` command line: serve, submit, watch, status, admin, creds, nats-config, demo.

Where to find NATS: ``--nats-url``, else ``$RATCHET_NATS_URL``, else the URL an embedded
node wrote under its state directory (``<state-dir>/nats/nats.url``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ratchet.actors.transport.bus import MB, StreamLimits
from ratchet.actors.transport.client import Client
from ratchet.actors.workflow.registry import Registry
from ratchet.protocol.admin_verbs import CLUSTER_VERBS, KEY_VERBS, SYSTEM_TENANT, VERB_ROLES
from ratchet.protocol.auth import ROLES, redact_url
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import (
    RatchetError,
    RemoteError,
    ToolDefinitionError,
    WorkflowDefinitionError,
)
from ratchet.protocol.ids import new_id
from ratchet.supervisors.node.credentials import admin_key_path, issue_key
from ratchet.supervisors.node.log_output import configure_logging, log_write_failures
from ratchet.supervisors.node.nats_auth import keyring_config
from ratchet.supervisors.node.node import Node, NodeConfig

__all__ = ["configure_logging", "main", "load_app"]

DEFAULT_STATE_DIR = os.environ.get("RATCHET_STATE_DIR", ".ratchet")


def load_app(spec: str) -> Registry:
    """Import ``module:object`` (a Registry, a Workflow, or a list of Workflows)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--app must look like module:object, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"{module_name} has no attribute {attr!r}") from None
    return Registry.coerce(obj)


def _nats_url(args: argparse.Namespace) -> str:
    if args.nats_url:
        return str(args.nats_url)
    if os.environ.get("RATCHET_NATS_URL"):
        return os.environ["RATCHET_NATS_URL"]
    url_file = Path(args.state_dir) / "nats" / "nats.url"
    if url_file.exists():
        return url_file.read_text().strip()
    raise SystemExit(f"no NATS URL: pass --nats-url, or run `ratchet serve` (no {url_file})")


def _creds(args: argparse.Namespace) -> Path | None:
    """The key to sign with: --creds, $RATCHET_CREDS, or this state dir's admin key."""
    given = args.creds or os.environ.get("RATCHET_CREDS")
    if given:
        return Path(given)
    local = admin_key_path(Path(args.state_dir))
    return local if local.exists() else None


async def _connect(args: argparse.Namespace, tenant: str) -> Client:
    return await Client.connect(_nats_url(args), tenant, creds=_creds(args))


def _print(obj: Any) -> None:
    print(json.dumps(obj, default=str), flush=True)


async def _serve(args: argparse.Namespace) -> int:
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
    _print({"serving": config.node_id, "nats_url": redact_url(node.url), "db": str(config.db_path),
            "workflows": registry.names(), "pid": os.getpid()})
    failed = asyncio.ensure_future(node.failed.wait())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([failed, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        failed.cancel()
        stopped.cancel()
        await node.stop()
        _print({"stopped": config.node_id, "failed": node.failed.is_set(),
                **node.writer_summary(), "log_write_failures": log_write_failures()})
    return 1 if node.failed.is_set() else 0


async def _submit(args: argparse.Namespace) -> int:
    client = await _connect(args, args.tenant)
    try:
        data = json.loads(args.input)
        if not isinstance(data, dict):
            raise SystemExit("--input must be a JSON object")
        if args.sync:
            _print(await client.submit_sync(args.workflow, data, args.key, version=args.version))
        else:
            task_id = await client.submit(args.workflow, data, args.key, version=args.version)
            _print({"task_id": task_id, "tenant": args.tenant})
    finally:
        await client.close()
    return 0


async def _watch(args: argparse.Namespace) -> int:
    client = await _connect(args, args.tenant)
    code = 0
    try:
        async for event in client.watch(args.task_id, after=args.after,
                                        follow_terminal=args.follow):
            _print(event.model_dump())
            if event.type == EventType.TASK_FAILED:
                code = 3
    finally:
        await client.close()
    return code


async def _status(args: argparse.Namespace) -> int:
    client = await _connect(args, args.tenant)
    try:
        _print((await client.get(args.task_id)).model_dump())
    finally:
        await client.close()
    return 0


def _graph(args: argparse.Namespace) -> int:
    workflow = load_app(args.app).get(args.workflow, args.version)
    if args.format in ("both", "table"):
        rows = [("from", "kind", "condition", "to"), *workflow.transition_table()]
        widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
        print(f"# {workflow.name} v{workflow.version}: start at {workflow.start}")
        for row in rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if args.format == "both":
        print()
    if args.format in ("both", "mermaid"):
        print(workflow.mermaid())
    return 0


async def _admin(args: argparse.Namespace) -> int:
    cluster = args.verb in CLUSTER_VERBS  # about nodes: the system tenant's subject
    client = await _connect(args, SYSTEM_TENANT if cluster else args.tenant)
    if args.verb in KEY_VERBS:  # grant, revoke: --tenant is the principal's tenant
        if args.verb != "keys":  # keys lists every tenant's (--arg tenant=T: one)
            args.arg.insert(0, f"tenant={args.tenant}")
        if args.task_id:
            args.arg.insert(1, f"name={args.task_id}")
        args.task_id = None
    elif cluster and args.task_id:
        args.arg.append(f"node={args.task_id}")
        args.task_id = None
    try:
        verb_args: dict[str, Any] = json.loads(args.args_json) if args.args_json else {}
        if not isinstance(verb_args, dict):
            raise SystemExit("--args must be a JSON object")
        for item in args.arg:
            key, _, value = item.partition("=")
            verb_args[key] = int(value) if value.isdigit() else value
        body = {"command_id": args.command_id or new_id("cmd"), "task_id": args.task_id,
                "args": verb_args}
        if args.expected_version is not None:
            body["expected_version"] = args.expected_version
        result = await client.request_admin(args.verb, body)
        _print(result)
    finally:
        await client.close()
    if args.verb == "verify-audit" and not result.get("ok"):
        return 1  # answered, and the chain is broken: scripts and cron must notice
    return 0


async def _issue(args: argparse.Namespace) -> int:
    """``ratchet creds``: a key for one principal, granted through the local admin key."""
    client = await _connect(args, SYSTEM_TENANT)
    try:
        _print(await issue_key(client, Path(args.out or f"{args.name}.nk"), args.name,
                               args.tenant, sorted(set(args.role)), args.expires_in))
    finally:
        await client.close()
    return 0


async def _nats_config(args: argparse.Namespace) -> int:
    print(await keyring_config(Path(args.state_dir)), end="", flush=True)
    return 0


def _clock_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--clock-step-threshold", type=float, default=5.0,
                   help="seconds the wall clock may jump against the steady clock before it"
                        " counts as a step")
    s.add_argument("--clock-step-hold", type=float, default=600.0,
                   help="seconds after a forward step before the timers it made due fire"
                        " (sooner with `admin clock-ack`); 0: never hold")


def _serve_flags(s: argparse.ArgumentParser) -> None:
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
    _clock_flags(s)
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ratchet", description="Ratchet durable task runtime")
    p.add_argument("--version", action="version",
                   version=f"ratchet {importlib.metadata.version('ratchet-runtime')}")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="default: .ratchet")
    p.add_argument("--log-level", default=os.environ.get("RATCHET_LOG_LEVEL", "info"))
    sub = p.add_subparsers(dest="command", required=True)

    def with_nats(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--nats-url", default=None)
        sp.add_argument("--tenant", default="default")
        sp.add_argument("--creds", default=None,
                        help="key file to sign with (default: $RATCHET_CREDS, else the"
                             " state dir's keys/local-admin.nk)")
        return sp

    _serve_flags(sub.add_parser("serve", help="run a node in the foreground"))

    s = with_nats(sub.add_parser("submit", help="publish a task request"))
    s.add_argument("workflow")
    s.add_argument("--input", default="{}", help="JSON object")
    s.add_argument("--key", required=True, help="idempotency key of the business request")
    s.add_argument("--version", type=int, default=None)
    s.add_argument("--sync", action="store_true", help="wait for the validated accept")

    s = with_nats(sub.add_parser("watch", help="print a task's events live"))
    s.add_argument("task_id")
    s.add_argument("--after", type=int, default=0, help="start after this sequence")
    s.add_argument("--follow", action="store_true", help="keep going after a terminal event")

    s = with_nats(sub.add_parser("status", help="print a task's snapshot"))
    s.add_argument("task_id")

    s = with_nats(sub.add_parser("admin", help="an admin command (docs/admin.md)"))
    s.add_argument("verb", choices=list(VERB_ROLES))
    s.add_argument("task_id", nargs="?", default=None,
                   help="the task (for drain, undrain and clock-ack: the node id; for"
                        " grant and revoke: the principal's name)")
    s.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="verb arguments, e.g. --arg after=5 --arg status=RUNNING")
    s.add_argument("--command-id", default=None, help="repeat one to get its first answer")
    s.add_argument("--expected-version", type=int, default=None,
                   help="act only if the task is still at this version")
    s.add_argument("--args", dest="args_json", default=None,
                   help='verb arguments as a JSON object, e.g. \'{"input": {"x": 1}}\'')

    s = with_nats(sub.add_parser("creds", help="issue a key: a seed file for one principal"
                                 " (docs/security.md)"))
    s.add_argument("--name", required=True, help="the principal's name (a token)")
    s.add_argument("--role", action="append", required=True, choices=sorted(ROLES),
                   help="a role of the key (repeat for several)")
    s.add_argument("--out", default=None, help="where to write the seed (default: NAME.nk)")
    s.add_argument("--expires-in", type=float, default=None, metavar="SECONDS",
                   help="the key is refused this long after it is granted")
    sub.add_parser("nats-config", help="print the keyring's nats-server authorization block"
                   " (for an external NATS)")

    s = sub.add_parser("graph", help="print a workflow's transition table and Mermaid diagram")
    s.add_argument("workflow")
    s.add_argument("--app", required=True, help="module:object registering workflows")
    s.add_argument("--version", type=int, default=None)
    s.add_argument("--format", choices=["both", "table", "mermaid"], default="both")

    s = sub.add_parser("demo", help="run the demo on the embedded default")
    s.add_argument("--nats-url", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level)
    handlers = {"serve": _serve, "submit": _submit, "watch": _watch, "status": _status,
                "admin": _admin, "creds": _issue, "nats-config": _nats_config}
    try:
        if args.command == "graph":
            return _graph(args)
        if args.command == "demo":
            # Test components are loaded only for `ratchet demo`, never into a serving node.
            from ratchet.testing.demo import run_demo

            return asyncio.run(run_demo(Path(args.state_dir), args.nats_url))
        return asyncio.run(handlers[args.command](args))
    except RemoteError as exc:
        _print({"error": exc.to_wire() | {"code": exc.wire_code}})
        return 2
    except (WorkflowDefinitionError, ToolDefinitionError):
        # A bad app is a bug to fix: its traceback and exit 1 (docs/workflows.md), not the
        # one-line error of a refused request.
        raise
    except RatchetError as exc:
        _print({"error": exc.to_wire()})
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
