"""Faults beyond SIGKILL for the chaos harness (issue 17), on one real ``ratchet serve``.

Each fault is struck at a moment of a run's task (as a kill is), lasts a second or a few,
and is repaired; while it lasts, *probes* are submitted over the API (``submit_sync``,
request/reply): each probe answered OK was acknowledged as durable by the node, and must
exist and finish after the repair (else it counts in ``acked_then_lost``).

- ``clock_forward`` / ``clock_back``: the node's wall clock steps +1 h / -1 h while it runs
  (libfaketime, offset read from a file the harness rewrites; the monotonic and boot clocks
  are not faked, as with an NTP step). After the task, the offset goes back to 0: after a
  forward step that is a step back, which ends the hold by itself; after a backward one it
  is a forward step, held, and released with ``ratchet admin clock-ack``.
- ``db_deleted``: ``ratchet.db``, ``-wal`` and ``-shm`` unlinked; the node must refuse work,
  exit non-zero and put its data back; the harness then starts it again.
- ``disk_full``: the state dir (and the node's log) is on a small tmpfs, filled with zeros
  for 1.5 s and freed; the node must refuse work (``UNAVAILABLE``) and resume by itself.
- ``purge_mail``: ``RATCHET_MAIL`` purged every 50 ms for 1 s.
- ``purge_submit``: ``RATCHET_SUBMIT`` purged while submits are queued in it: bursts of
  JetStream submits on a tenant of the run's own, each followed by purges, for about a
  second (bench/submit_burst.py: what a purge may take and what it must not).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import ratchet
from bench.steps import NodeProc
from bench.submit_burst import SubmitBurst, purge_stream
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.errors import RemoteError
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import SubmitTask
from ratchet.protocol.subjects import STREAM_MAIL
from ratchet.testing import FinanceClient

FAULT_KINDS = ("clock_forward", "clock_back", "db_deleted", "disk_full", "purge_mail",
               "purge_submit")
SETTLED = ("SUCCEEDED", "FAILED", "UNKNOWN", "WAITING_APPROVAL")
# libfaketime 0.9.10 answers EINVAL to Python's time.sleep (clock_nanosleep on
# CLOCK_MONOTONIC, TIMER_ABSTIME) when the monotonic clock is not faked; the expense tools
# sleep after each call (RATCHET_CHAOS_POST_CALL_PAUSE). The node under the fake clock gets
# this sitecustomize, which sleeps on an Event instead (the same wait, another syscall).
SLEEP_FIX = """import threading, time
time.sleep = lambda seconds: threading.Event().wait(max(0.0, seconds)) and None
"""


def libfaketime() -> str | None:
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    return str(found[0]) if found else None


def fill(path: Path) -> None:
    """Write zeros until the disk refuses (unbuffered, so nothing is left to flush)."""
    with open(path, "wb", buffering=0) as fh:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
            chunk = bytes(size)
            try:
                while fh.write(chunk):
                    pass
            except OSError:
                continue


class FaultBed:
    """The node the faults are struck on: its state dir on a 128 MB tmpfs (when one can be
    mounted; else ``disk_full`` is skipped, with the reason), under libfaketime with offset
    0 (when installed; else the clock kinds are skipped), ``--recovery-interval 2`` so mail
    lost to a purge is made good within the run rather than in 30 s."""

    def __init__(self, base: Path, nats_url: str, finance_url: str) -> None:
        self.skipped: dict[str, str] = {}
        self.disk = base / "disk"
        self.disk.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs",
                                  str(self.disk)], capture_output=True)
        self.mounted = mounted.returncode == 0
        if not self.mounted:
            self.skipped["disk_full"] = ("cannot mount a tmpfs: "
                                         + mounted.stderr.decode().strip())
        env = {"RATCHET_FINANCE_URL": finance_url, "RATCHET_CHAOS_POST_CALL_PAUSE": "0.1"}
        self.offset = base / "faketime.rc"
        self.offset.write_text("+0\n")
        preload = libfaketime()
        if preload is None:
            for kind in ("clock_forward", "clock_back"):
                self.skipped[kind] = "libfaketime is not installed"
        else:
            fix = base / "sleepfix"
            fix.mkdir()
            (fix / "sitecustomize.py").write_text(SLEEP_FIX)
            env |= {"LD_PRELOAD": preload, "FAKETIME_TIMESTAMP_FILE": str(self.offset),
                    "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (str(fix), os.environ.get("PYTHONPATH")) if p)}
        self.node = NodeProc(self.disk / "node", nats_url, app="ratchet.testing.expense:app",
                             log_level="error", synchronous="NORMAL", env=env,
                             args=("--recovery-interval", "2"),
                             log_path=self.disk / "node.log" if self.mounted else None)
        self.db = self.disk / "node" / "ratchet.db"

    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in FAULT_KINDS if k not in self.skipped)

    def close(self) -> None:
        self.node.stop()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.disk)], check=False)


class Probes:
    """Submissions over the API while a fault lasts: which were acknowledged, which not."""

    def __init__(self, client: ratchet.Client, run: int) -> None:
        self.client = client
        self.run = run
        self.acked: dict[str, str] = {}  # task id -> report id
        self.refused: dict[str, int] = {}

    async def one(self) -> str:
        report = f"probe-{self.run}-{len(self.acked) + sum(self.refused.values())}"
        body = SubmitTask(workflow="expense.split", idempotency_key=report, input={
            "report_id": report, "employee": "e-2", "travel": 1, "hotel": 2,
            "fail_after_writes": False})
        try:
            result = await self.client.request("submit", MessageType.TASK_SUBMIT,
                                               body.model_dump(), timeout=2.0)
        except RemoteError as exc:
            kind = exc.wire_code
        except Exception:  # no responders, a timeout: the node is gone or going
            kind = "none"
        else:
            self.acked[str(result["task_id"])] = report
            return "ok"
        self.refused[kind] = self.refused.get(kind, 0) + 1
        return kind

    async def during(self, window: Awaitable[Any]) -> Any:
        """Probe every 50 ms (at most 40) until ``window`` is done; returns its result."""
        job = asyncio.ensure_future(window)
        sent = 0
        while not job.done() and sent < 40:
            await self.one()
            sent += 1
            await asyncio.sleep(0.05)  # pacing, as a client would
        return await job

    async def audit(self, db: Path, finance: FinanceClient,
                    timeout: float = 60.0) -> dict[str, Any]:
        """Wait (bounded) for every acknowledged probe to settle; count the lost ones and
        their effects at the provider (a SUCCEEDED probe: each claim exactly once)."""
        lost, double, missing = await audit_tasks(db, finance, self.acked, timeout)
        return {"probes_acked": len(self.acked), "probes_refused": self.refused,
                "acked_then_lost": lost,
                "probe_double": double, "probe_missing": missing}


async def audit_tasks(db: Path, finance: FinanceClient, tasks: dict[str, str],
                      timeout: float = 60.0) -> tuple[int, int, int]:
    """(lost, double, missing) of acknowledged ``expense.split`` tasks (task id → report
    id): not settled within ``timeout``; a claim effective twice; SUCCEEDED without each
    claim effective once."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        statuses = _statuses(db, list(tasks))
        if all(statuses.get(t) in SETTLED for t in tasks) or \
                asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)  # polling the store, not waiting for a timer
    effects = finance.effects()
    lost = double = missing = 0
    for task_id, report in tasks.items():
        claims = [effects.get(f"claim:{report}:{k}:submit", 0) for k in ("travel", "hotel")]
        lost += statuses.get(task_id) not in SETTLED
        double += any(c > 1 for c in claims)
        missing += statuses.get(task_id) == "SUCCEEDED" and claims != [1, 1]
    return lost, double, missing


def _statuses(db: Path, task_ids: list[str]) -> dict[str, str]:
    if not task_ids or not db.exists():
        return {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        marks = ",".join("?" * len(task_ids))
        return dict(conn.execute(
            f"SELECT task_id, status FROM tasks WHERE task_id IN ({marks})", task_ids))


async def _until(cond: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await cond():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.2)  # polling the node's heartbeat
    return True


class Fault:
    """One run's fault: :meth:`strike` at the chosen moment of the task (the fault, the
    probes while it lasts, the repair that cannot wait), :meth:`settle` after the task
    (the repair that can: the clock set right; then the probes' audit)."""

    def __init__(self, kind: str, bed: FaultBed, client: ratchet.Client,
                 finance: FinanceClient, run: int) -> None:
        self.kind = kind
        self.bed = bed
        self.client = client
        self.system = ratchet.Client(client.nc, "_system", client.signer)
        self.finance = finance
        self.probes = Probes(client, run)
        self.burst: SubmitBurst | None = None
        self.facts: dict[str, Any] = {}

    async def strike(self, task_id: str, run: int) -> None:
        if self.kind.startswith("clock_"):
            await self.probes.during(self._step("+1h" if self.kind == "clock_forward"
                                                else "-1h"))
        elif self.kind == "db_deleted":
            await self._db_deleted()
        elif self.kind == "disk_full":
            await self._disk_full()
        elif self.kind == "purge_submit":  # purged while submits are queued in it
            self.burst = SubmitBurst(self.client, run)
            await self.probes.during(self.burst.strike())
        else:
            await self.probes.during(self._purge(STREAM_MAIL))

    async def settle(self) -> dict[str, Any]:
        if self.kind.startswith("clock_"):
            await self._step("+0")  # the NTP server fixed
            if self.kind == "clock_back":  # setting it right was a forward step: held
                released = await self._admin("clock-ack", {"node": await self._node_id()})
                self.facts["clock_ack_released_s"] = released["released_s"]
        audit = await self.probes.audit(self.bed.db, self.finance)
        if self.burst is not None:  # its submits in the store are acknowledged too
            in_store = _statuses(self.bed.db, list(self.burst.published))
            self.facts |= self.burst.accounting(set(in_store))
            lost, double, missing = await audit_tasks(self.bed.db, self.finance, {
                t: r for t, r in self.burst.published.items() if t in in_store})
            audit["acked_then_lost"] += lost
            audit["probe_double"] += double
            audit["probe_missing"] += missing
        return {**self.facts, **audit}

    async def _admin(self, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        return await self.system.request_admin(verb, {
            "command_id": new_id("cmd"), "args": args})

    async def _node_id(self) -> str:
        nodes = (await self._admin("nodes", {}))["nodes"]
        return str(next(n["node_id"] for n in nodes if n["alive"]))

    async def _clock_steps(self) -> int:
        nodes = (await self._admin("nodes", {}))["nodes"]
        return sum(int((n["info"] or {}).get("clock_steps", 0)) for n in nodes if n["alive"])

    async def _step(self, offset: str) -> None:
        """Rewrite the fake clock's offset; wait (bounded) until the node reports the step
        in its heartbeat (libfaketime rereads the file every second)."""
        before = await self._clock_steps()
        self.bed.offset.write_text(offset + "\n")

        async def seen() -> bool:
            return await self._clock_steps() > before

        detected = await _until(seen, 10.0)
        self.facts.setdefault("clock_steps_detected", []).append(detected)

    async def _purge(self, stream: str) -> None:
        purged = 0
        for _ in range(20):
            purged += await purge_stream(self.client.nc, stream)
            await asyncio.sleep(0.05)  # purge again a little later
        self.facts["purged_messages"] = purged

    async def _db_deleted(self) -> None:
        node = self.bed.node
        assert node.proc is not None
        for suffix in ("", "-wal", "-shm"):  # what `rm ratchet.db*` does
            Path(f"{self.bed.db}{suffix}").unlink(missing_ok=True)
        proc = node.proc

        async def exited() -> int | None:
            try:
                return await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                return None

        code = await self.probes.during(exited())
        if code is None:  # did not notice: stop it, so the run goes on (and says so)
            node.kill()
        self.facts |= {"exit_code": code, "db_put_back": self.bed.db.exists()}
        await asyncio.to_thread(node.start)

    async def _disk_full(self) -> None:
        filler = self.bed.disk / "filler"
        await asyncio.to_thread(fill, filler)
        await self.probes.during(asyncio.sleep(1.5))
        filler.unlink()

        async def resumed() -> bool:
            return await self.probes.one() == "ok"

        self.facts["resumed"] = await _until(resumed, 30.0)


def fault_summary(summary: dict[str, Any], results: list[dict[str, Any]],
                  skipped: dict[str, str]) -> dict[str, Any]:
    """The harness's summary with the faults' figures: ``acked_then_lost`` (probes answered
    OK that never existed or never settled after the repair), the probes' doubled and
    missing effects added to the tasks', runs per kind and what each kind saw."""
    by_kind: dict[str, int] = {}
    for r in results:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + 1
    faulted = [r for r in results if r["kind"] in FAULT_KINDS]
    seen: dict[str, dict[str, Any]] = {}
    for r in faulted:
        facts = seen.setdefault(r["kind"], {})
        for key in ("probes_acked", "purged_messages", "clock_ack_released_s",
                    "burst_published", "burst_accepted", "burst_lost", "burst_unexplained"):
            if key in r:
                facts[key] = round(facts.get(key, 0) + r[key], 3)
        if "purged_messages" in r:
            facts.setdefault("purged_by_run", []).append(r["purged_messages"])
        for code, n in r.get("probes_refused", {}).items():
            refused = facts.setdefault("probes_refused", {})
            refused[code] = refused.get(code, 0) + n
        for key in ("exit_code", "db_put_back", "resumed"):
            if key in r:
                counts = facts.setdefault(key, {})
                counts[str(r[key])] = counts.get(str(r[key]), 0) + 1
        if "clock_steps_detected" in r:
            facts["steps_detected"] = facts.get("steps_detected", 0) + sum(
                r["clock_steps_detected"])
            facts["steps_made"] = facts.get("steps_made", 0) + len(r["clock_steps_detected"])
    moments = summary.pop("kill_points")  # here: the moment each fault (a kill too) struck
    return {
        **summary,
        "double_effects": summary["double_effects"] + sum(r["probe_double"] for r in faulted),
        "missing_effects": summary["missing_effects"] + sum(
            r["probe_missing"] for r in faulted),
        "acked_then_lost": sum(r["acked_then_lost"] for r in faulted),
        # JetStream-acked submits missing from the store beyond what the purges removed
        "submits_lost_unpurged": sum(r.get("burst_unexplained", 0) for r in faulted),
        "probes_acked": sum(r["probes_acked"] for r in faulted),
        "runs_by_fault": by_kind,
        "strike_moments": moments,
        "faults_seen": seen,
        "skipped_faults": skipped,
    }
