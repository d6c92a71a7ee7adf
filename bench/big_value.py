"""Peak memory of a node whose step returns one large value. Prints one JSON object.

- rss_before_mb: the node's VmRSS once serving, idle;
- peak_rss_mb: its VmHWM after the task ended;
- outcome: the task's terminal event (``task.failed`` with INVALID_STATE_VALUE when the
  value is over ``--max-value-mb``).

Usage: ``python bench/big_value.py --mb 100`` (the node's default limits: 16 MiB per value,
64 MiB per checkpoint) or ``--mb 100 --limit-mb 256`` (limits lifted past the value, as
before they existed). The node is a real ``ratchet serve`` subprocess with its embedded
nats-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.steps import NodeProc

wf = ratchet.Workflow("big", version=1)


@wf.step
async def produce(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"blob": "x" * int(ctx.input["mb"] * 1024 * 1024)}


@wf.step
async def finish(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"size": len(ctx.state["blob"])}}


app = ratchet.Registry([wf])


async def run(mb: float, limit_mb: float | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        limits = ("--max-value-mb", str(limit_mb), "--max-checkpoint-mb",
                  str(limit_mb)) if limit_mb else ()
        node = NodeProc(Path(tmp) / "node", None, "bench.big_value:app", args=limits)
        node.start()
        try:
            assert node.url is not None
            rss_before = node.status("VmRSS") / 1024
            client = await ratchet.Client.connect(node.url, tenant="bench", creds=node.creds)
            started = time.perf_counter()
            task_id = await client.submit("big", {"mb": mb}, key=f"big-{time.time_ns()}")
            events = [e async for e in client.watch(task_id, idle_timeout=120)]
            elapsed = time.perf_counter() - started
            await client.close()
            last = events[-1]
            return {"value_mb": mb, "limit_mb": limit_mb or "default",
                    "rss_before_mb": round(rss_before, 1),
                    "peak_rss_mb": round(node.status("VmHWM") / 1024, 1),
                    "outcome": last.type,
                    "code": (last.payload.get("error") or {}).get("code"),
                    "seconds": round(elapsed, 2)}
        finally:
            node.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--limit-mb", type=float, default=None)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.mb, args.limit_mb))))


if __name__ == "__main__":
    main()
