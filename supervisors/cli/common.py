"""What every client command shares: where NATS is, which key signs, the app to load, the
exit codes, and how to print (``emit``, from ``cli/output.py``)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from enum import IntEnum
from pathlib import Path

from ratchet.actors.transport.client import Client
from ratchet.actors.transport.servers import join_servers
from ratchet.actors.workflow.registry import Registry
from ratchet.protocol.errors import UsageError
from ratchet.supervisors.cli.output import emit
from ratchet.supervisors.node.credentials import admin_key_path

__all__ = ["DEFAULT_STATE_DIR", "ExitCode", "connect", "emit", "load_app", "nats_url",
           "signing_key"]

DEFAULT_STATE_DIR = os.environ.get("RATCHET_STATE_DIR", ".ratchet")


class ExitCode(IntEnum):
    """What the ``ratchet`` command's exit status means (docs/cli.md)."""

    #: Done as asked.
    OK = 0
    #: Something failed that is not the caller's to fix: the node stopped because it failed,
    #: ``admin verify-audit`` found the chain broken, a workflow definition is invalid (its
    #: traceback), an unexpected error.
    FAILED = 1
    #: The command cannot be done as given: a usage error (one line on stderr), or a typed
    #: error a node answered (``{"error": {"code": ...}}``: NOT_FOUND, ILLEGAL_TRANSITION,
    #: UNAUTHENTICATED, ...).
    USAGE = 2
    #: The watched task ended FAILED.
    TASK_FAILED = 3
    #: ``submit --wait`` (or ``watch``): the task was cancelled.
    TASK_CANCELLED = 4
    #: ``submit --wait``: the task waits for a human (UNKNOWN, a handoff).
    TASK_HANDED_OFF = 5
    #: ``submit --wait --timeout``: no outcome in time (the task goes on).
    TIMEOUT = 6
    #: ``serve`` refused to start (docs/operations.md): its node id is in use (``serve``
    #: twice on one state dir), the store has another partition count, the store is read
    #: only, NATS cannot be reached, the asked NATS port is taken.
    NODE_ID_IN_USE = 10
    PARTITION_COUNT_MISMATCH = 11
    STORE_READ_ONLY = 12
    NATS_UNREACHABLE = 13
    NATS_PORT_TAKEN = 14
    #: ``serve`` started but was not ready (store writable, NATS connected, leases held or
    #: none on purpose) within ``--ready-timeout``; one line on stderr names what was not.
    NOT_READY = 15
    #: ``serve`` refused to start: the store's schema is newer than this release knows.
    SCHEMA_VERSION_MISMATCH = 16
    #: ``serve --store postgresql://…`` refused to start: the database cannot be reached.
    STORE_UNREACHABLE = 17
    #: ``serve`` refused to start: its audit key is not the one the store's audit chain is
    #: sealed under (docs/security.md, "The audit key").
    AUDIT_KEY_MISMATCH = 18
    #: Stopped by Ctrl-C before it was done (128 + SIGINT).
    INTERRUPTED = 130


def _names_module(missing: str | None, module_name: str) -> bool:
    """Whether the module import could not find is ``module_name`` or a package of it (and
    not a module that the app itself imports)."""
    return missing is not None and (missing == module_name
                                    or module_name.startswith(missing + "."))


def load_app(spec: str) -> Registry:
    """Import ``module:object`` (a Registry, a Workflow, or a list of Workflows).

    Raises:
        UsageError: ``spec`` is not ``module:object``, the module is not found (from the
            working directory or ``PYTHONPATH``), or it has no such object or one of
            another kind. An import error inside the module is the app's own: it is raised
            as is, with its traceback.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--app {spec!r} is not module:object; name the module and the"
                         " Registry it defines, e.g. --app myflows:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not _names_module(exc.name, module_name):
            raise
        raise UsageError(f"--app {spec!r}: no module named {exc.name!r} in {os.getcwd()} or"
                         " on PYTHONPATH; run from the folder that holds it, or set"
                         " PYTHONPATH") from None
    if not hasattr(module, attr):
        raise UsageError(f"--app {spec!r}: module {module_name!r} has no attribute {attr!r};"
                         " name the Registry it defines, e.g. --app myflows:app")
    found = getattr(module, attr)
    try:
        return Registry.coerce(found)
    except (TypeError, AttributeError):  # not workflows (an iterable of something else)
        raise UsageError(f"--app {spec!r} is a {type(found).__name__}, not a Registry, a"
                         " Workflow or a list of Workflows") from None


def nats_url(args: argparse.Namespace) -> str:
    """Where the command finds NATS: one URL, or a cluster's, comma-separated."""
    if args.nats_url:
        return str(join_servers(args.nats_url))
    if os.environ.get("RATCHET_NATS_URL"):
        return os.environ["RATCHET_NATS_URL"]
    url_file = Path(args.state_dir) / "nats" / "nats.url"
    if url_file.exists():
        return url_file.read_text().strip()
    raise UsageError(f"no NATS URL: pass --nats-url or set RATCHET_NATS_URL, or start a node"
                     f" with `ratchet serve` (no {url_file})")


def signing_key(args: argparse.Namespace) -> Path | None:
    """The key to sign with: --creds, $RATCHET_CREDS, or this state dir's admin key."""
    given = args.creds or os.environ.get("RATCHET_CREDS")
    if given:
        return Path(given)
    local = admin_key_path(Path(args.state_dir))
    return local if local.exists() else None


async def connect(args: argparse.Namespace, tenant: str) -> Client:
    return await Client.connect(nats_url(args), tenant, creds=signing_key(args))
