"""Workflow for ``fanout_100_join_ms`` in bench/fanout.py: the peer benchmark's W3
(``../shared/peers/ratchet_wf.py``): one fan-out node of 100 one-step branches, each step
appending one line to a file (no fsync), joined with ``JoinPolicy("all")``,
``max_concurrency=100``. A five-step task warms the node up before the measured runs.
``bench.fan100x10`` is the same with ten-step branches (``fanout_100x10_join_ms``)."""

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

#: ``fanout_100x10_join_ms``: 100 branches of ten trivial steps (each branch commits its
#: progress before each step but its first: 900 checkpoints a run).
_ten = ratchet.Workflow("bench.ten")
for _i in range(10):
    async def _count(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"n": ctx.state.get("n", 0) + 1}

    _ten.add_step(f"s{_i}", _count)

fan100x10 = ratchet.Workflow("bench.fan100x10")
fan100x10.fanout("spread", {f"b{j}": _ten for j in range(1, WIDTH + 1)}, join="gather",
                 max_concurrency=WIDTH)
fan100x10.join("gather", of="spread", policy=JoinPolicy("all"), next=END)

app = ratchet.Registry([fan100, fan100x10, warm])
