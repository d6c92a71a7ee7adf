"""Durable-step figures of one node. Prints one JSON object as its last line.

(a) sequential_steps_per_s: one task of 1,000 trivial durable steps (task.started →
    task.succeeded, timestamps recorded by the node), median of 5 runs;
    sequential_node_cpu_us_per_step: the node process's CPU (user + system, /proc) over
    those runs / their steps — the figure that moves least with the machine's load;
(b) concurrent_tasks_per_s, concurrent_p50_s, concurrent_p99_s: the peer harness's W2 —
    200 tasks x 5 steps published at once over NATS, submit → task.succeeded as seen by a
    subscriber; the median of 5 such rounds (concurrent_node_cpu_us_per_task: the node's
    CPU per task over them). concurrent_1000_tasks_per_s, concurrent_1000_p50_s,
    concurrent_1000_p99_s: one round of 1,000 such tasks at once (what (b) measured before
    the W2 shape: its p99 is close to the whole round by construction);
(c) peak_rss_mb: the node process's VmHWM after (a) and (b); then the node's closing
    figures: commit_* (group-commit batches) and, with FULL, sync_* / batches_per_sync
    (the WAL syncs: persistence/syncer.py);
(d) bytes_written_per_step: a 100-step task whose state holds an unchanging 1 MB value,
    on a fresh store: growth of the SQLite file (WAL checkpointed, blobs included) / 100;
    also wal_io_bytes_per_step: what the node process physically wrote (/proc/pid/io);
(e) synchronous: the SQLite setting of the figures under the plain keys: ``FULL`` (the
    default) unless ``--synchronous NORMAL``; with ``--synchronous both`` (the default)
    (a)-(c) and the commit figures are measured again on a NORMAL node, under ``normal_*``;
(f) resume_after_kill_s: a 20-step task (50 ms per step), node SIGKILLed right after step
    10 committed, then started again: restart command → task.succeeded;
    restart_to_ready_s: the same kill, restart command → ``serving`` (bench/restart.py);
(g) first_submit_accept_ms: on a fresh node (its own new store), the first submission of a
    tenant the node has never seen: publish → its ``task.queued`` event at a subscriber;
    the first new tenant's figure, and the median of five new tenants in a row;
(h) fanout_100_join_ms: the peer benchmark's W3 (100 one-step branches, join "all"),
    submit → ``task.succeeded``, median on a node of its own (bench/fanout.py).

The node is a real ``ratchet serve`` subprocess joined to a real nats-server (``--nats-url``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RATCHET_BIN = Path(sys.executable).with_name("ratchet")  # the installed entry point
sys.path.insert(0, str(ROOT))

import ratchet
from bench.restart import restart_to_ready
from ratchet.protocol.codec import decode_map, encode
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.messages import Envelope, SubmitTask
from ratchet.protocol.subjects import submit_subject
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.credentials import admin_key_path
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

#: The setting of the nodes the bench scripts start (``ratchet serve``'s own default unless
#: RATCHET_BENCH_SYNCHRONOUS says otherwise; steps.py: ``--synchronous``).
SYNCHRONOUS = os.environ.get("RATCHET_BENCH_SYNCHRONOUS", "FULL")


def percentile(values: list[float], p: float) -> float:
    """The value at rank ``p`` (0..1) of ``values``, nearest rank below."""
    ordered = sorted(values)
    return ordered[int(p * (len(ordered) - 1))]


async def publish_submit(client: ratchet.Client, workflow: str, key: str,
                         input: dict[str, Any] | None = None) -> Any:
    """What ``client.submit`` publishes, without waiting for the ack: returns its future."""
    mid = new_id("msg")
    env = Envelope(type="task.submit", message_id=mid, correlation_id=mid,
                   body=SubmitTask(workflow=workflow, idempotency_key=key,
                                   input=input or {}).model_dump())
    return await client.js.publish_async(submit_subject(client.tenant), encode(env),
                                         headers={"Nats-Msg-Id": f"{client.tenant}:{key}"})


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class NodeProc:
    """A ``ratchet serve`` subprocess; ``start`` returns once it says it is serving."""

    def __init__(self, state_dir: Path, nats_url: str | None, app: str = "bench.app:app", *,
                 log_level: str = "warning", synchronous: str | None = None,
                 env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                 log_path: Path | None = None) -> None:
        """``args``: extra ``serve`` flags (``--node-id``, ``--writer``, ...); ``log_path``:
        append the node's log (stderr) to this file instead of inheriting stderr;
        ``nats_url`` None: the node starts its embedded server (``url`` once started)."""
        self.state_dir = state_dir
        self.url = nats_url
        joined = ["--nats-url", nats_url] if nats_url else []
        self.args = [str(RATCHET_BIN), "--state-dir", str(state_dir),
                     "--log-level", log_level, "serve", "--app", app,
                     *joined, "--synchronous", synchronous or SYNCHRONOUS, *args]
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.log_path is None:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=subprocess.PIPE,
                                         env=self.env)
        else:
            with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
                self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=subprocess.PIPE,
                                             stderr=log, env=self.env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if b"serving" not in line:
            raise RuntimeError(f"node did not start: {line!r}")
        #: The serving line: ``nats_url``, ``console`` (with ``--console-port``), ...
        self.serving: dict[str, Any] = json.loads(line)
        self.url = self.serving["nats_url"]

    @property
    def creds(self) -> Path:
        """The node's local admin key (made at its first start): what clients sign with."""
        return admin_key_path(self.state_dir)

    def status(self, field: str) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def io_write_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
        raise KeyError("write_bytes")

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far (/proc/pid/stat)."""
        assert self.proc is not None
        return proc_cpu_seconds(self.proc.pid)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> dict[str, Any]:
        """SIGINT (a clean stop); returns the node's closing figures line."""
        if self.proc is None or self.proc.poll() is not None:
            return {}
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=60)
        for line in (out or b"").decode().splitlines():
            if '"stopped"' in line:
                return dict(json.loads(line))
        return {}


async def _until_terminal(client: ratchet.Client, task_id: str) -> list[ratchet.Event]:
    return [e async for e in client.watch(task_id, idle_timeout=120)]


async def sequential(client: ratchet.Client, node: NodeProc | None = None,
                     runs: int = 5) -> dict[str, Any]:
    """Median of ``runs`` one-task runs (one run is ~0.3 s, so single runs are noisy)."""
    rates, walls = [], []
    cpu0 = node.cpu_seconds() if node else 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        task_id = (await client.submit("seq1000", {}, key=f"seq-{time.time_ns()}")).task_id
        events = await _until_terminal(client, task_id)
        walls.append(time.perf_counter() - t0)
        started = next(e for e in events if e.type == "task.started").occurred_at
        assert events[-1].type == "task.succeeded", events[-1]
        rates.append(1000 / (events[-1].occurred_at - started))
    figures = {"sequential_steps_per_s": round(statistics.median(rates), 1),
               "sequential_steps_per_s_min": round(min(rates), 1),
               "sequential_wall_s": round(statistics.median(walls), 3)}
    if node:
        cpu = node.cpu_seconds() - cpu0
        figures["sequential_node_cpu_us_per_step"] = round(cpu / (runs * 1000) * 1e6, 1)
    return figures


async def concurrent(client: ratchet.Client, node: NodeProc | None = None, n: int = 200,
                     rounds: int = 5, prefix: str = "concurrent") -> dict[str, Any]:
    """``rounds`` rounds of ``n`` five-step tasks submitted at once; medians of the rounds'
    figures, under ``prefix``_*."""
    cpu0 = node.cpu_seconds() if node else 0.0
    runs = [await concurrent_round(client, n) for _ in range(rounds)]
    figures = {f"{prefix}_{k}": round(statistics.median(r[k] for r in runs), 3)
               for k in runs[0]}
    if node:
        cpu = node.cpu_seconds() - cpu0
        figures[f"{prefix}_node_cpu_us_per_task"] = round(cpu / (rounds * n) * 1e6, 1)
    return figures


async def concurrent_round(client: ratchet.Client, n: int) -> dict[str, Any]:
    done: dict[str, float] = {}
    all_done = asyncio.Event()

    async def on_success(msg: Any) -> None:
        event = decode_map(msg.data)
        done.setdefault(event["task_id"], time.perf_counter())
        if len(done) >= n:
            all_done.set()

    sub = await client.nc.subscribe(f"ratchet.events.{client.tenant}.*.task.succeeded",
                                    cb=on_success)
    run = time.time_ns()
    submitted: dict[str, float] = {}
    t0 = time.perf_counter()
    futures = []
    for i in range(n):
        key = f"c-{run}-{i}"
        submitted[task_id_for(client.tenant, key)] = time.perf_counter()
        futures.append(await publish_submit(client, "five", key))
    await asyncio.gather(*futures)
    await asyncio.wait_for(all_done.wait(), 300)
    elapsed = time.perf_counter() - t0
    await sub.unsubscribe()
    latencies = sorted(done[t] - submitted[t] for t in submitted)
    return {
        "tasks_per_s": round(n / elapsed, 1),
        "p50_s": round(statistics.median(latencies), 3),
        "p99_s": round(percentile(latencies, 0.99), 3),
        "total_s": round(elapsed, 3),
    }


def _store_bytes(db: Path) -> int:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


async def big_document(nats_url: str, base: Path) -> dict[str, Any]:
    node = NodeProc(base / "big", nats_url)
    node.start()
    try:
        db = base / "big" / "ratchet.db"
        before = _store_bytes(db)
        io_before = node.io_write_bytes()
        client = await ratchet.Client.connect(nats_url, "bench", creds=node.creds)
        task_id = (await client.submit("big_document", {}, key=f"big-{time.time_ns()}")).task_id
        events = await _until_terminal(client, task_id)
        assert events[-1].type == "task.succeeded"
        io_after = node.io_write_bytes()
        await client.close()
        after = _store_bytes(db)
    finally:
        node.stop()
    return {"bytes_written_per_step": round((after - before) / 100),
            "wal_io_bytes_per_step": round((io_after - io_before) / 100)}


async def resume_after_kill(nats_url: str, base: Path) -> dict[str, Any]:
    node = NodeProc(base / "kill", nats_url)
    node.start()
    client = await ratchet.Client.connect(nats_url, "bench", creds=node.creds)
    task_id = (await client.submit("sleepy", {}, key=f"sleepy-{time.time_ns()}")).task_id
    async for event in client.watch(task_id, idle_timeout=60):
        if event.type == "step.completed" and event.payload["index"] == 9:
            node.kill()
            break
    t0 = time.perf_counter()
    restarted = NodeProc(base / "kill", nats_url)
    restarted.proc = subprocess.Popen(restarted.args, cwd=ROOT, stdout=subprocess.DEVNULL,
                                      env=restarted.env)
    last = None
    async for event in client.watch(task_id, after=0, idle_timeout=60):
        last = event
    resume = time.perf_counter() - t0
    assert last is not None and last.type == "task.succeeded"
    await client.close()
    restarted.stop()
    return {"resume_after_kill_s": round(resume, 3)}


async def first_submit_accept(nats_url: str, base: Path, tenants: int = 5) -> dict[str, Any]:
    node = NodeProc(base / "fresh", nats_url)
    node.start()
    client = await ratchet.Client.connect(nats_url, "bench", creds=node.creds)
    waits: list[float] = []
    try:
        for i in range(tenants):
            newcomer = ratchet.Client(client.nc, f"new{time.time_ns()}x{i}", client.signer)
            queued = asyncio.Event()

            async def on_queued(msg: Any, queued: asyncio.Event = queued) -> None:
                queued.set()

            sub = await client.nc.subscribe(f"ratchet.events.{newcomer.tenant}.*.task.queued",
                                            cb=on_queued)
            await client.nc.flush()  # subscribed before the submission goes out
            t0 = time.perf_counter()
            await publish_submit(newcomer, "five", "first")
            await asyncio.wait_for(queued.wait(), 30)
            waits.append(time.perf_counter() - t0)
            await sub.unsubscribe()
    finally:
        await client.close()
        node.stop()
    return {"first_submit_accept_ms": round(waits[0] * 1000, 1),
            "first_submit_accept_ms_median": round(statistics.median(waits) * 1000, 1)}


async def node_figures(url: str, base: Path, synchronous: str) -> dict[str, Any]:
    """(a)-(c) on one node with ``synchronous``, and its closing commit/sync figures."""
    node = NodeProc(base / f"main-{synchronous.lower()}", url, synchronous=synchronous,
                    args=tuple(os.environ.get("RATCHET_BENCH_SERVE_ARGS", "").split()))
    node.start()
    results: dict[str, Any] = {}
    client = await ratchet.Client.connect(url, "bench", creds=node.creds)
    try:
        results.update(await sequential(client, node))
        results.update(await concurrent(client, node))  # W2: 200 at once, 5 rounds
        results.update(await concurrent(client, node, n=1000, rounds=1,
                                        prefix="concurrent_1000"))
        results["peak_rss_mb"] = round(node.status("VmHWM") / 1024, 1)
    finally:
        await client.close()
        closing = node.stop()
    results.update({k: v for k, v in closing.items() if k.startswith(("commit_", "sync"))
                    or k in ("largest_batch", "batches_per_sync")})
    return results


async def fanout_100_join(url: str, base: Path) -> dict[str, Any]:
    """(h) the peer benchmark's W3 (bench/fanout.py's ``join_100``) on the default setting."""
    from bench.fanout import join_100  # bench/fanout.py imports this module's NodeProc

    w3 = await join_100(base, SYNCHRONOUS)
    return {"fanout_100_join_ms": w3["ms"], "fanout_100_node_cpu_ms": w3["cpu_ms"]}


#: What one run measures, in order: (name, async fn(url, base) -> figures). Each part runs
#: on the setting under test (the first of --synchronous); add new figures as a part.
PARTS: list[tuple[str, Callable[[str, Path], Awaitable[dict[str, Any]]]]] = [
    ("big_document", big_document),
    ("resume_after_kill", resume_after_kill),
    ("restart_to_ready", restart_to_ready),
    ("first_submit", first_submit_accept),
    ("fanout_100_join", fanout_100_join),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synchronous", choices=["FULL", "NORMAL", "both"],
                    default=os.environ.get("RATCHET_BENCH_SYNCHRONOUS", "both"),
                    help="both (default): FULL under the plain keys, NORMAL under normal_*")
    ap.add_argument("--parts", default=",".join(name for name, _ in PARTS),
                    help="the figures beyond (a)-(c), comma-separated ('' for none)")
    return ap.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = ["FULL", "NORMAL"] if args.synchronous == "both" else [args.synchronous]
    wanted = [part for part in args.parts.split(",") if part]
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="ratchet-bench-") as tmp:
        base = Path(tmp)
        server = EmbeddedNats(base / "nats")
        url = await server.start()
        results: dict[str, Any] = {"synchronous": settings[0]}
        try:
            results.update(await node_figures(url, base, settings[0]))
            for other in settings[1:]:
                figures = await node_figures(url, base, other)
                results.update({f"{other.lower()}_{k}": v for k, v in figures.items()})
            global SYNCHRONOUS
            SYNCHRONOUS = settings[0]  # the default of every NodeProc of the parts below
            for name, part in PARTS:
                if name in wanted:
                    results.update(await part(url, base))
        finally:
            await server.stop()
        print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
