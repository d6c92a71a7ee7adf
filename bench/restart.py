"""Restart figures: a node SIGKILLed mid-task and started again. Prints one JSON object as
its last line.

The task is ``sleepy`` (bench/app.py: 20 steps of 50 ms); the node is killed right after
step 10 committed (its ``step.completed`` event, index 9, seen by the driver), then the same
``ratchet serve`` command is run again on the same state dir:

- ``restart_to_ready_s``: restart command → the node's ``serving`` line (ready: streams,
  request services, leases taken, tasks recovered);
- ``resume_after_kill_s``: restart command → ``task.succeeded`` seen by the driver (floor:
  10 steps of 50 ms: 0.5 s);
- ``restart_startup_ms``: the restarted node's own start-up phases (its ``serving`` line's
  ``startup_ms``: supervisors/node/startup.py), when it reports them.

Two ways to NATS, as in production: ``joined`` (the node joins a nats-server the bench
runs, ``--nats-url``: the client stays connected across the restart) and ``embedded`` (the
node starts its own nats-server from its state dir, so the restart includes that server's
start and JetStream recovery; the client connects again once the node serves — as
the peer harness's W4 does).

    python bench/restart.py [--runs 3] [--synchronous NORMAL|FULL]

``bench/steps.py`` calls :func:`restart_to_ready` (joined) for its ``restart_to_ready_s``.
The node is started from the checkout whose ``ratchet`` the interpreter imports, so an
interpreter of another checkout measures that checkout (an A/B without copying files).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ratchet
from ratchet.supervisors.node.credentials import admin_key_path
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.supervisors.node.log_output import configure_logging

#: The checkout the node runs from (its bench/app.py serves ``sleepy``).
ROOT = Path(ratchet.__file__).resolve().parent.parent
RATCHET_BIN = Path(sys.executable).with_name("ratchet")
#: Index of the step whose ``step.completed`` triggers the kill (the 10th of 20).
KILL_AFTER_INDEX = 9


class Serving:
    """A ``ratchet serve`` subprocess of the bench app and the moment it said ``serving``."""

    def __init__(self, state_dir: Path, nats_url: str | None, synchronous: str) -> None:
        joined = ["--nats-url", nats_url] if nats_url else []
        self.args = [str(RATCHET_BIN), "--state-dir", str(state_dir), "--log-level", "warning",
                     "serve", "--app", "bench.app:app", *joined, "--synchronous", synchronous]
        self.proc: asyncio.subprocess.Process | None = None
        self.line: dict[str, Any] = {}
        self.ready_at = 0.0

    async def spawn(self) -> float:
        """Start the process; returns the moment the command was run (perf_counter)."""
        started = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            *self.args, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL)
        return started

    async def serving(self, timeout: float = 60.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        self.ready_at = time.perf_counter()
        if b'"serving"' not in line:
            raise RuntimeError(f"node did not start: {line!r}")
        self.line = json.loads(line)
        return self.line

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        """SIGINT (a clean stop), then wait for the exit."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(self.proc.communicate(), 60)


async def _until_succeeded(client: ratchet.Client, task_id: str) -> float:
    """Follow the task's events from the start until its last; when it was seen."""
    last = None
    async for event in client.watch(task_id, after=0, idle_timeout=60):
        last = event
    if last is None or last.type != "task.succeeded":
        raise RuntimeError(f"task {task_id} ended {last.type if last else 'without events'}")
    return time.perf_counter()


async def _killed_mid_task(state: Path, nats_url: str | None,
                           synchronous: str) -> tuple[str, ratchet.Client]:
    """Start a node, submit ``sleepy``, SIGKILL the node after step 10 committed; returns
    the task id and the client (still connected when NATS is not the node's own)."""
    first = Serving(state, nats_url, synchronous)
    await first.spawn()
    url = (await first.serving())["nats_url"]
    client = await ratchet.Client.connect(url, "bench", creds=admin_key_path(state))
    try:
        handle = await client.submit("sleepy", {}, key=f"sleepy-{time.time_ns()}")
        async for event in client.watch(handle.task_id, idle_timeout=60):
            if event.type == "step.completed" and event.payload["index"] == KILL_AFTER_INDEX:
                await first.kill()
                break
    except BaseException:
        await client.close()
        await first.stop()
        raise
    return handle.task_id, client


async def restart_after_kill(nats_url: str | None, base: Path,
                             synchronous: str = "NORMAL") -> dict[str, Any]:
    """One kill and restart (see the module's doc); ``nats_url`` None: embedded NATS."""
    state = base / f"restart-{time.time_ns()}"
    task_id, client = await _killed_mid_task(state, nats_url, synchronous)
    if nats_url is None:  # its server died with the node; it connects again below
        with contextlib.suppress(Exception):  # closing a connection that is reconnecting
            await client.close()
    restarted = Serving(state, nats_url, synchronous)
    try:
        t0 = await restarted.spawn()
        if nats_url is not None:  # connected all along: follow the task while it starts
            done = asyncio.ensure_future(_until_succeeded(client, task_id))
            await restarted.serving()
            t_done = await done
        else:
            url = (await restarted.serving())["nats_url"]
            client = await ratchet.Client.connect(url, "bench", creds=admin_key_path(state))
            t_done = await _until_succeeded(client, task_id)
    finally:
        await client.close()
        await restarted.stop()
    out: dict[str, Any] = {"restart_to_ready_s": round(restarted.ready_at - t0, 3),
                           "resume_after_kill_s": round(t_done - t0, 3)}
    if "startup_ms" in restarted.line:
        out["restart_startup_ms"] = restarted.line["startup_ms"]
    return out


async def restart_to_ready(nats_url: str, base: Path) -> dict[str, Any]:
    """``bench/steps.py``'s restart figure: ``restart_to_ready_s`` on a joined NATS."""
    figures = await restart_after_kill(nats_url, base)
    return {"restart_to_ready_s": figures["restart_to_ready_s"]}


def _medians(runs: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {f"{prefix}{k}": statistics.median(r[k] for r in runs)
                           for k in ("restart_to_ready_s", "resume_after_kill_s")}
    phases = [r["restart_startup_ms"] for r in runs if "restart_startup_ms" in r]
    if phases:
        out[f"{prefix}restart_startup_ms"] = {
            k: round(statistics.median(p.get(k, 0.0) for p in phases), 1) for k in phases[0]}
    out[f"{prefix}resume_after_kill_runs"] = [r["resume_after_kill_s"] for r in runs]
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--synchronous", default="NORMAL", choices=("NORMAL", "FULL"))
    args = parser.parse_args()
    configure_logging("warning")
    joined: list[dict[str, Any]] = []
    embedded: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ratchet-restart-") as tmp:
        base = Path(tmp)
        server = EmbeddedNats(base / "nats")
        url = await server.start()
        try:
            for _ in range(args.runs):  # alternated: both see the same load
                joined.append(await restart_after_kill(url, base, args.synchronous))
                embedded.append(await restart_after_kill(None, base, args.synchronous))
        finally:
            await server.stop()
    print(json.dumps({"synchronous": args.synchronous, "runs": args.runs,
                      "checkout": str(ROOT), **_medians(joined, ""),
                      **_medians(embedded, "embedded_")}))


if __name__ == "__main__":
    asyncio.run(main())
