"""Peak memory of a node whose step returns one large value. Prints one JSON object.

- value_mb: the value's size (its msgpack encoding, within a few bytes);
- rss_before_mb: the node's VmRSS once serving, idle, just before the submit (its VmHWM is
  reset there, through ``/proc/<pid>/clear_refs``);
- peak_mb: its VmHWM after the task ended: the most it held while the step made the value,
  the checkpoint wrote it and the next steps ran beside it;
- copies: (peak_mb - rss_before_mb) / value_mb, how many copies of the value the node held
  at once at its peak, the value itself included (1.0 would be the value alone);
- outcome / code: the task's terminal event (``task.failed`` with INVALID_STATE_VALUE when
  the value is over ``--max-value-mb``).
- seconds: submit to the terminal event (with ``--restart``: the restart included).

``--kind``: ``str`` (ASCII), ``text`` (non-ASCII str), ``bytes``, or ``list`` (1 KiB strs:
a container, encoded again at every later step). ``--restart``: SIGKILL the node while the
task waits after the value was checkpointed, start it again and measure the recovery
(which loads the value from the store) instead.

Usage: ``python bench/large_values.py --mb 15`` (the node's default limits: 16 MiB per
value, 64 MiB per checkpoint) or ``--mb 100 --limit-mb 256`` (limits lifted past the
value). The node is a real ``ratchet serve`` subprocess with its embedded nats-server.
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

MiB = 1024 * 1024
wf = ratchet.Workflow("big", version=1)


def make_value(kind: str, mb: float) -> Any:
    size = int(mb * MiB)
    if kind == "str":
        return "x" * size
    if kind == "text":
        return "é" * (size // 2)  # two bytes each in UTF-8
    if kind == "bytes":
        return b"x" * size
    return ["y" * 1021] * (size // 1024)  # one str object repeated: the list is the value


@wf.step
async def produce(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"blob": make_value(ctx.input["kind"], ctx.input["mb"])}


@wf.step
async def wait(ctx: ratchet.StepContext) -> dict[str, Any]:
    hold = Path(ctx.input["hold"]) if ctx.input.get("hold") else None
    for _ in range(1200):  # until the harness removes the file (it kills the node first)
        if hold is None or not hold.exists():
            break
        await asyncio.sleep(0.05)
    return {"n": 1}


@wf.step
async def finish(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"size": len(ctx.state["blob"])}}


app = ratchet.Registry([wf])


def reset_peak(node: NodeProc) -> float:
    """Reset the node's VmHWM to its VmRSS; returns that, in MiB."""
    assert node.proc is not None
    try:
        Path(f"/proc/{node.proc.pid}/clear_refs").write_text("5")
    except OSError:  # not permitted here: the peak then counts the start-up's too
        pass
    return node.status("VmRSS") / 1024


async def run(mb: float, kind: str, limit_mb: float | None, restart: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        limits = ("--max-value-mb", str(limit_mb), "--max-checkpoint-mb",
                  str(limit_mb)) if limit_mb else ()
        node = NodeProc(Path(tmp) / "node", None, "bench.large_values:app", args=limits)
        node.start()
        try:
            assert node.url is not None
            client = await ratchet.Client.connect(node.url, tenant="bench", creds=node.creds)
            hold = Path(tmp) / "hold"
            if restart:
                hold.touch()
            rss_before = reset_peak(node)
            started = time.perf_counter()
            task_id = (await client.submit("big", {"mb": mb, "kind": kind,
                                                  "hold": str(hold) if restart else None},
                                          key=f"big-{time.time_ns()}")).task_id
            if restart:
                async for event in client.watch(task_id, idle_timeout=120):
                    if event.type == "step.completed":
                        break
                await client.close()
                node.kill()
                hold.unlink()
                node.start()  # the same state dir; its embedded server starts again
                assert node.url is not None
                client = await ratchet.Client.connect(node.url, tenant="bench", creds=node.creds)
                rss_before = reset_peak(node)  # before the recovery has loaded much
            events = [e async for e in client.watch(task_id, idle_timeout=120)]
            elapsed = time.perf_counter() - started
            await client.close()
            last = events[-1]
            peak = node.status("VmHWM") / 1024
            return {"value_mb": mb, "kind": kind, "limit_mb": limit_mb or "default",
                    "restart": restart, "rss_before_mb": round(rss_before, 1),
                    "peak_mb": round(peak, 1), "copies": round((peak - rss_before) / mb, 2),
                    "outcome": last.type, "code": (last.payload.get("error") or {}).get("code"),
                    "seconds": round(elapsed, 2)}
        finally:
            node.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=15.0)
    parser.add_argument("--kind", choices=["str", "text", "bytes", "list"], default="str")
    parser.add_argument("--limit-mb", type=float, default=None)
    parser.add_argument("--restart", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.mb, args.kind, args.limit_mb, args.restart))))


if __name__ == "__main__":
    main()
