"""What every client command shares: where NATS is, which key signs, how to print."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ratchet.actors.transport.client import Client
from ratchet.actors.workflow.registry import Registry
from ratchet.supervisors.node.credentials import admin_key_path

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


def nats_url(args: argparse.Namespace) -> str:
    if args.nats_url:
        return str(args.nats_url)
    if os.environ.get("RATCHET_NATS_URL"):
        return os.environ["RATCHET_NATS_URL"]
    url_file = Path(args.state_dir) / "nats" / "nats.url"
    if url_file.exists():
        return url_file.read_text().strip()
    raise SystemExit(f"no NATS URL: pass --nats-url, or run `ratchet serve` (no {url_file})")


def signing_key(args: argparse.Namespace) -> Path | None:
    """The key to sign with: --creds, $RATCHET_CREDS, or this state dir's admin key."""
    given = args.creds or os.environ.get("RATCHET_CREDS")
    if given:
        return Path(given)
    local = admin_key_path(Path(args.state_dir))
    return local if local.exists() else None


async def connect(args: argparse.Namespace, tenant: str) -> Client:
    return await Client.connect(nats_url(args), tenant, creds=signing_key(args))


def emit(obj: Any) -> None:
    print(json.dumps(obj, default=str), flush=True)
