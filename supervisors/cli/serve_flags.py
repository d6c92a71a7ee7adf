"""``ratchet serve``'s flags (docs/operations.md lists them all with their meaning)."""

from __future__ import annotations

import argparse
import os

from ratchet.persistence.store_select import STORE_ENV, is_postgres_url
from ratchet.protocol.errors import UsageError
from ratchet.supervisors.cli.serve_health import console_flags, observability_flags

__all__ = ["serve_flags", "store_location"]


def risk_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--risk-policy", default=None, metavar="FILE", help="JSON: per tenant"
                   " and tool, tighten risk tiers (requires_approval, max_amount)")
    # Settling writes (docs/side-effects.md, "Settling writes nobody recorded").
    s.add_argument("--cancel-timeout", type=float, default=30.0, metavar="S",
                   help="how long a cancel waits for a write in flight before detaching it")
    s.add_argument("--settle-after", type=float, default=300.0, metavar="S",
                   help="the action sweeper settles writes left unsettled this long")
    s.add_argument("--settle-interval", type=float, default=60.0, metavar="S",
                   help="seconds between the action sweeper's passes")


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
    s.add_argument("--nats-url", action="append", default=None, metavar="URL[,URL...]",
                   help="join this NATS instead of the embedded one; a cluster's servers"
                   " comma-separated or the flag repeated")
    s.add_argument("--nats-replicas", type=int, default=1, metavar="N",
                   help="copies JetStream keeps of each stream (3 on a 3-server cluster;"
                   " at most the number of servers)")
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


def store_flags(s: argparse.ArgumentParser) -> None:
    """Where the store is, and (SQLite) how durable its commits are."""
    s.add_argument("--store", default=None, metavar="URL",
                   help="the store: a postgresql:// URL (default: $RATCHET_STORE, else the"
                   " SQLite file in --state-dir)")
    s.add_argument("--audit-key-file", default=None, metavar="FILE",
                   help="the audit chain's key (64 hex digits or base64 of 32 bytes), the"
                   " same on every node of the store (default: $RATCHET_AUDIT_KEY, else"
                   " <state-dir>/keys/audit.key)")
    s.add_argument("--synchronous", default="FULL", choices=["NORMAL", "FULL"],
                   help="SQLite durability: FULL (default) syncs every commit before anything"
                   " depends on it; NORMAL does not (an OS crash may lose the last commits)")


def serve_flags(s: argparse.ArgumentParser) -> None:
    """The flags of `ratchet serve` (each sets a NodeConfig field; docs/operations.md)."""
    s.add_argument("--app", required=True, help="module:object registering workflows")
    nats_flags(s)
    store_flags(s)
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
    s.add_argument("--dead-letters-max", type=int, default=10_000,
                   help="dead letters the store keeps; the oldest go beyond it")
    s.add_argument("--dead-letters-max-mb", type=float, default=64.0,
                   help="MiB of raw messages the store's dead letters keep at most")
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
    console_flags(s)
    observability_flags(s)


def submit_rate_flags(s: argparse.ArgumentParser) -> None:
    """Per-tenant submit rate limits at intake (supervisors/services/rate_limits.py)."""
    # Canary versions (supervisors/services/canary.py): where new tasks go, like the rates.
    s.add_argument("--route-new-tasks", action="append", default=[],
                   metavar="WORKFLOW=VERSION:PERCENT", help="canary: PERCENT of WORKFLOW's new"
                   " tasks that name no version go to VERSION (the rest: the latest)")
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


def store_location(flag: str | None) -> str | None:
    """``--store``, else ``$RATCHET_STORE``: a PostgreSQL URL, or None (the SQLite file in
    the state dir).

    Raises:
        UsageError: the value is not a ``postgresql://`` URL.
    """
    location = flag or os.environ.get(STORE_ENV) or None
    if location is not None and not is_postgres_url(location):
        where = "--store" if flag else STORE_ENV
        raise UsageError(f"{where} takes a postgresql:// URL (without it the store is the"
                         " SQLite file in --state-dir)")
    return location
