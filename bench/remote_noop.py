"""A no-op tool for bench/actions.py's ``remote_tool_overhead_p50_us``: declared here for the
node (``remote_noop``) and served with its code by ``ratchet tool-worker --app
bench.remote_noop:tools`` in another process; ``local_noop`` is the same code in process."""

from __future__ import annotations

from pydantic import BaseModel

import ratchet


class NoopArgs(BaseModel):
    i: int


class NoopResult(BaseModel):
    i: int


async def _noop(ctx: ratchet.ToolContext, args: NoopArgs) -> NoopResult:
    return NoopResult(i=args.i)


remote_noop = ratchet.remote_tool("noop", kind="read", args=NoopArgs, result=NoopResult)
local_noop = ratchet.tool(kind="read", args=NoopArgs, result=NoopResult, name="local_noop")(_noop)
tools = [ratchet.served_by(remote_noop, _noop)]
