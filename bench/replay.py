"""Replay figures (issue 15, items 1 and 2). Prints one JSON object as its last line.

A real node (in process, on an embedded nats-server, a fresh SQLite store) records
``rb.long`` (one task of 1,000 trivial steps) and 1,000 tasks of ``rb.five`` (5 nodes: a
read, a write, a choice, two steps; bench/replay_app.py), 30 of them with an input that
plants a change in the candidate version (10 each: a write's argument, the route, a step's
state). Then, with the node stopped:

(a) replay_steps_per_s: the 1,000-step task replayed (its history read from the store
    opened read-only, and replayed) — steps / wall seconds;
(b) corpus_tasks_per_s: the 1,000 ``rb.five`` tasks exported to a file (``ratchet export``'s
    code) and replayed from it against version 1 — tasks / wall seconds of the replay
    (reading the file included), and every one without divergence;
(c) provider_calls_during_replay: the tools' real calls during (a), (b) and (d): must be 0;
(d) divergences_found / divergences_planted: the same corpus replayed against version 2 with
    its planted changes: one divergence per planted task, none elsewhere.
"""

from __future__ import annotations

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
from bench.replay_app import CALLS, app, candidate
from ratchet.actors.replay import (
    export_tasks,
    open_read_only,
    read_recordings,
    read_task,
    replay_corpus,
    replay_recording,
)
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.credentials import admin_key_path, ensure_key
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

TASKS = 1000
PLANTS = ("arg", "route", "state")
PLANTED_EACH = 10


async def record(state: Path) -> tuple[str, list[str]]:
    """Run the tasks on a node; the long task's id and the five-node tasks' ids."""
    server = EmbeddedNats(state / "nats-server")
    url = await server.start()
    ensure_key(admin_key_path(state / "node"))
    node = ratchet.Node(ratchet.NodeConfig(state_dir=state / "node", nats_url=url), app)
    await node.start()
    client = await ratchet.Client.connect(url, tenant="bench",
                                          creds=admin_key_path(state / "node"))
    try:
        long_task = await client.submit("rb.long", {}, key="long")
        gate = asyncio.Semaphore(64)

        async def submit(i: int) -> Any:
            plant = PLANTS[i // PLANTED_EACH] if i < PLANTED_EACH * len(PLANTS) else None
            async with gate:
                return await client.submit("rb.five", {"ref": f"r{i}", "plant": plant},
                                           key=f"five-{i}")

        handles = await asyncio.gather(*(submit(i) for i in range(TASKS)))
        long_id, ids = long_task.task_id, [h.task_id for h in handles]
        # submit only publishes: wait until the store holds every task, finished (a
        # benchmark may poll; nothing here is timed)
        deadline = time.monotonic() + 300
        while _finished(state / "node" / "ratchet.db") < TASKS + 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the recorded tasks did not finish in 300 s")
            await asyncio.sleep(0.2)
        return long_id, list(ids)
    finally:
        await client.close()
        await node.stop()
        await server.stop()


def _finished(db: Path) -> int:
    conn = open_read_only(db)
    try:
        counts = dict(conn.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status"))
    finally:
        conn.close()
    assert not set(counts) - {"QUEUED", "RUNNING", "SUCCEEDED"}, counts
    return int(counts.get("SUCCEEDED", 0))


async def measure(state: Path, long_id: str) -> dict[str, Any]:
    db = state / "node" / "ratchet.db"
    calls = sum(CALLS.values())
    started = time.perf_counter()
    conn = open_read_only(db)
    recording = read_task(conn, long_id)
    conn.close()
    long_report = await replay_recording(recording, app)
    long_s = time.perf_counter() - started
    assert long_report.ok and len(long_report.steps) == 1000, long_report.to_dict()["divergences"]

    corpus = state / "five.rtc"
    exported = export_tasks(db, corpus, workflow="rb.five", status="SUCCEEDED")
    started = time.perf_counter()
    same = await replay_corpus(read_recordings(corpus), candidate, version=1)
    corpus_s = time.perf_counter() - started
    assert same.ok and len(same.reports) == TASKS == exported, same.to_dict()["summary"]

    planted = await replay_corpus(read_recordings(corpus), candidate, version=2)
    kinds: dict[str, int] = {}
    for d in (d for r in planted.reports for d in r.divergences):
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    return {
        "replay_steps_per_s": round(len(long_report.steps) / long_s),
        "corpus_tasks_per_s": round(len(same.reports) / corpus_s),
        "corpus_tasks": len(same.reports),
        "provider_calls_during_replay": sum(CALLS.values()) - calls,
        "divergences_found": sum(kinds.values()),
        "divergences_planted": PLANTED_EACH * len(PLANTS),
        "divergent_tasks": len(planted.divergent),
        "divergences_by_kind": kinds,
        "export_bytes": corpus.stat().st_size,
    }


async def main() -> None:
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="ratchet-bench-replay-") as tmp:
        state = Path(tmp)
        started = time.perf_counter()
        long_id, _ = await record(state)
        recorded_s = time.perf_counter() - started
        figures = await measure(state, long_id)
    print(json.dumps({"bench": "replay", **figures, "recording_s": round(recorded_s, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
