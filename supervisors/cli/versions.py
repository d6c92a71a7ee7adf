"""``ratchet versions``: per workflow, each version — registered on the node that answers
or only found on tasks — with its definition hash and the tenant's tasks on it by status
(the ``versions`` admin verb, supervisors/services/admin_versions.py; docs/cli.md)."""

from __future__ import annotations

import argparse
from typing import Any

from ratchet.protocol.ids import new_id
from ratchet.supervisors.cli.common import ExitCode, connect, emit

__all__ = ["versions", "version_rows"]


async def versions(args: argparse.Namespace) -> int:
    client = await connect(args, args.tenant)
    try:
        answer = await client.request_admin("versions", {"command_id": new_id("cmd"),
                                                         "args": {}})
    finally:
        await client.close()
    rows = version_rows(answer)
    if args.workflow:
        rows = [r for r in rows if r["workflow"] == args.workflow]
    emit({"tenant": answer.get("tenant"), "versions": rows})
    return ExitCode.OK


def version_rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The verb's answer as one row per (workflow, version), for a table or a script."""
    return [{"workflow": wf["workflow"], **v} for wf in answer.get("workflows", [])
            for v in wf["versions"]]
