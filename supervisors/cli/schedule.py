"""``ratchet schedule``: create, list, delete, pause and resume a tenant's schedules
through the admin verbs ``schedule-*`` (docs/admin.md; ticks: protocol/schedules.py).

    ratchet schedule create nightly report.daily --cron '0 2 * * *' --timezone Europe/Paris \\
        --input '{"scope": "all"}' --missed latest
    ratchet schedule create poll inbox.check --every 300
    ratchet schedule list
    ratchet schedule pause nightly; ratchet schedule resume nightly
    ratchet schedule delete nightly
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ratchet.protocol.ids import new_id
from ratchet.protocol.schedules import MAX_CATCH_UP, MISSED_POLICIES
from ratchet.supervisors.cli.common import connect, emit

__all__ = ["schedule", "schedule_flags"]

Flags = Callable[[argparse.ArgumentParser], argparse.ArgumentParser]


def schedule_flags(sp: argparse.ArgumentParser, with_nats: Flags) -> None:
    """The ``schedule`` subcommand's actions; each takes the NATS and tenant options."""
    actions = sp.add_subparsers(dest="schedule_action", required=True)
    c = with_nats(actions.add_parser("create", help="a schedule of a workflow, with an input"))
    c.add_argument("name", help="the schedule's name (letters, digits, _ and -)")
    c.add_argument("workflow")
    when = c.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="five fields: minute hour day-of-month month day-of-week")
    when.add_argument("--every", type=int, metavar="SECONDS", help="a fixed interval")
    c.add_argument("--timezone", default="UTC", help="IANA zone the cron is read in")
    c.add_argument("--input", default="{}", help="JSON object: each task's input")
    c.add_argument("--missed", choices=MISSED_POLICIES, default="skip",
                   help="ticks missed while no node ran them (default: skip)")
    c.add_argument("--catch-up", type=int, default=10,
                   help=f"catch_up: at most this many missed ticks run (1..{MAX_CATCH_UP})")
    c.add_argument("--version", type=int, default=None, help="the workflow version")
    c.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="each task's deadline")
    with_nats(actions.add_parser("list", help="the tenant's schedules"))
    for action, what in (("delete", "remove"), ("pause", "stop firing"),
                         ("resume", "fire again from the next tick")):
        with_nats(actions.add_parser(action, help=f"{what} a schedule")).add_argument("name")


def _verb_args(args: argparse.Namespace) -> dict[str, Any]:
    if args.schedule_action == "list":
        return {}
    if args.schedule_action != "create":
        return {"name": args.name}
    try:
        task_input = json.loads(args.input)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--input is not JSON: {exc}") from None
    if not isinstance(task_input, dict):
        raise ValueError("--input must be a JSON object")
    out: dict[str, Any] = {"name": args.name, "workflow": args.workflow, "input": task_input,
                           "missed": args.missed, "catch_up": args.catch_up}
    if args.cron is not None:
        out.update(cron=args.cron, timezone=args.timezone)
    else:
        out["every"] = args.every
    if args.version is not None:
        out["version"] = args.version
    if args.deadline is not None:
        out["deadline_s"] = args.deadline
    return out


async def schedule(args: argparse.Namespace) -> int:
    """Send one ``schedule-<action>`` admin command; print its answer."""
    try:
        verb_args = _verb_args(args)
    except ValueError as exc:
        print(f"ratchet schedule: {exc}", file=sys.stderr)
        return 2
    client = await connect(args, args.tenant)
    try:
        emit(await client.request_admin(f"schedule-{args.schedule_action}", {
            "command_id": new_id("cmd"), "task_id": None, "args": verb_args}))
    finally:
        await client.close()
    return 0
