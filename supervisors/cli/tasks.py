"""Commands about one task: submit, watch, status; and ``graph`` of a workflow."""

from __future__ import annotations

import argparse
import json

from ratchet.protocol.catalogue import EventType
from ratchet.supervisors.cli.common import connect, emit, load_app


async def submit(args: argparse.Namespace) -> int:
    client = await connect(args, args.tenant)
    try:
        data = json.loads(args.input)
        if not isinstance(data, dict):
            raise SystemExit("--input must be a JSON object")
        if args.sync:
            emit(await client.submit_sync(args.workflow, data, args.key, version=args.version,
                                          priority=args.priority))
        else:
            task_id = await client.submit(args.workflow, data, args.key, version=args.version,
                                          priority=args.priority)
            emit({"task_id": task_id, "tenant": args.tenant})
    finally:
        await client.close()
    return 0


async def watch(args: argparse.Namespace) -> int:
    client = await connect(args, args.tenant)
    code = 0
    try:
        async for event in client.watch(
            args.task_id, after=args.after, follow_terminal=args.follow
        ):
            emit(event.model_dump())
            if event.type == EventType.TASK_FAILED:
                code = 3
    finally:
        await client.close()
    return code


async def status(args: argparse.Namespace) -> int:
    client = await connect(args, args.tenant)
    try:
        emit((await client.get(args.task_id)).model_dump())
    finally:
        await client.close()
    return 0


def graph(args: argparse.Namespace) -> int:
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
