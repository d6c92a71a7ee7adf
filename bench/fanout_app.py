"""Workflow for ``fanout_100_join_ms`` in bench/fanout.py: the peer benchmark's W3
(``../shared/peers/ratchet_wf.py``): one fan-out node of 100 one-step branches, each step
appending one line to a file (no fsync), joined with ``JoinPolicy("all")``,
``max_concurrency=100``. A five-step task warms the node up before the measured runs."""

from __future__ import annotations

import os
from typing import Any

import ratchet
from ratchet import END, JoinPolicy

WIDTH = 100


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


_leaf = ratchet.Workflow("bench.leaf")


@_leaf.step
async def leaf(ctx: ratchet.StepContext) -> dict[str, Any]:
    _append(ctx.input["log"], f"{ctx.task_id} {ctx.branch}\n")
    return {"output": {"branch": ctx.branch}}


fan100 = ratchet.Workflow("bench.fan100")
fan100.fanout("spread", {f"b{j}": _leaf for j in range(1, WIDTH + 1)}, join="gather",
              max_concurrency=WIDTH)
fan100.join("gather", of="spread", policy=JoinPolicy("all"), next=END)

warm = ratchet.Workflow("bench.warm")
for _i in range(5):
    async def _step(ctx: ratchet.StepContext) -> None:
        return None

    warm.add_step(f"s{_i}", _step)

app = ratchet.Registry([fan100, warm])
