"""``admin`` verbs, ``creds`` (issue a key), ``nats-config`` and ``console-login``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ratchet.protocol.admin_verbs import CLUSTER_VERBS, KEY_VERBS, SYSTEM_TENANT
from ratchet.protocol.auth import Signer
from ratchet.protocol.errors import UsageError
from ratchet.protocol.ids import new_id
from ratchet.supervisors.cli.common import ExitCode, connect, emit, signing_key
from ratchet.supervisors.console import login_code
from ratchet.supervisors.node.credentials import issue_key
from ratchet.supervisors.node.nats_auth import keyring_config


async def admin(args: argparse.Namespace) -> int:
    if args.verb == "dlq" or args.ids:
        dlq_arguments(args)
    cluster = args.verb in CLUSTER_VERBS  # about nodes: the system tenant's subject
    client = await connect(args, SYSTEM_TENANT if cluster else args.tenant)
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
        verb_args: dict[str, Any] = dict(args.args_json or {})  # a JSON object (the parser)
        for item in args.arg:
            key, _, value = item.partition("=")
            verb_args[key] = int(value) if value.isdigit() else value
        verb_args.update(settle_args(args))
        verb_args.update(fork_args(args))
        body = {
            "command_id": args.command_id or new_id("cmd"),
            "task_id": args.task_id,
            "args": verb_args,
        }
        if args.expected_version is not None:
            body["expected_version"] = args.expected_version
        result = await client.request_admin(args.verb, body)
        emit(result)
    finally:
        await client.close()
    if args.verb == "verify-audit" and not result.get("ok"):
        return ExitCode.FAILED  # answered, and the chain is broken: scripts and cron must notice
    return ExitCode.OK


#: The settling verbs' own flags (the parser), by the argument each one sets (and
#: ``migrate``'s ``--to-version``).
_SETTLE_FLAGS = ("action", "outcome", "evidence", "request_hash", "result", "provider_id",
                 "reason", "to_version")


def settle_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--action K --outcome O ...`` as verb arguments (those given; text as it is: a key
    of digits stays a string)."""
    return {name: getattr(args, name) for name in _SETTLE_FLAGS
            if getattr(args, name, None) is not None}


def fork_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--sandbox`` and ``--reuse-model`` as ``fork``'s boolean arguments (those given)."""
    return {name: True for name in ("sandbox", "reuse_model") if getattr(args, name, None)}


def dlq_arguments(args: argparse.Namespace) -> None:
    """``admin dlq list|show|replay|purge [ID ...]`` as the verbs ``dlq-list`` ... with
    ``id`` (show) or ``ids`` (replay, purge) arguments."""
    actions = ("list", "show", "replay", "purge")
    if args.verb != "dlq" or args.task_id not in actions:
        raise UsageError(f"usage: ratchet admin dlq {{{'|'.join(actions)}}} [ID ...]")
    args.verb, args.task_id = f"dlq-{args.task_id}", None
    if args.verb == "dlq-show" and len(args.ids) == 1:
        args.arg.append(f"id={args.ids[0]}")
    elif args.verb == "dlq-show" or (args.ids and args.verb == "dlq-list"):
        raise UsageError("usage: ratchet admin dlq show ID")
    elif args.ids:
        args.args_json = {**(args.args_json or {}), "ids": args.ids}


async def diagnose(args: argparse.Namespace) -> int:
    """``ratchet diagnose TASK``: the ``diagnose`` admin verb."""
    client = await connect(args, args.tenant)
    try:
        emit(await client.request_admin("diagnose", {"command_id": new_id("cmd"),
                                                     "task_id": args.task_id, "args": {}}))
    finally:
        await client.close()
    return ExitCode.OK


async def issue(args: argparse.Namespace) -> int:
    """``ratchet creds``: a key for one principal, granted through the local admin key."""
    client = await connect(args, SYSTEM_TENANT)
    try:
        emit(
            await issue_key(
                client,
                Path(args.out or f"{args.name}.nk"),
                args.name,
                args.tenant,
                sorted(set(args.role)),
                args.expires_in,
            )
        )
    finally:
        await client.close()
    return 0


async def nats_config(args: argparse.Namespace) -> int:
    # The store nodes of this state dir use: RATCHET_STORE (postgresql://…), else SQLite.
    store = getattr(args, "store", None) or os.environ.get("RATCHET_STORE") or None
    print(await keyring_config(Path(args.state_dir), store), end="", flush=True)
    return 0


def console_login(args: argparse.Namespace) -> int:
    """``ratchet console-login CHALLENGE --node N``: the web console's login code, signed
    here with the key (``--creds``, ``$RATCHET_CREDS`` or the local admin key); the seed
    stays on this machine (docs/security.md, "The web console")."""
    key = signing_key(args)
    if key is None:
        raise UsageError("no key to sign with: --creds FILE or $RATCHET_CREDS")
    print(login_code(Signer.from_file(key), args.challenge, args.node), flush=True)
    return ExitCode.OK
