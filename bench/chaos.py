"""Chaos harness: SIGKILL a node at random points of a task with two writes, restart it,
and check that every business action took effect at the provider exactly once (or the
task is UNKNOWN / waiting for a human with a handoff) — never twice, never lost.

    python bench/chaos.py --runs 200 [--seed 7] [--nodes 3] [--nats-cluster 3]

Each run submits ``expense.split`` (two claims; in about a third of the runs a later step
fails for good, so the saga refunds both) and kills the node at one of: before the call
(right after IN_FLIGHT committed), after the provider committed but before the result was
recorded (tools pause 100 ms after the provider answered), mid-compensation, or a random
moment. The node is restarted at once. Two more points: ``rerun_detour`` kills after the
provider committed the hotel claim of a task whose re-run takes another path (it looks the
claim up and does not submit it again: the recovery must settle the first write by query),
and ``cancel_during_call`` sends an operator's cancel while a claim is in flight (the
cancel must wait for its outcome, then refund every claim made). ``unsettled_actions_after_run``
counts writes still IN_FLIGHT or UNKNOWN on tasks that ended. Prints one JSON object (last
line).

With ``--nodes N`` (N > 1) N nodes share the store and NATS; each run kills the node that
owns the task's partition at that moment and starts a replacement (see :class:`Nodes`).
With ``--nats-cluster N`` NATS is N servers (streams with N replicas) and each kill of a
node comes with the SIGKILL of one NATS server, in turn (bench/nats_under_test.py).

    python bench/chaos.py --faults all --runs 100
    python bench/chaos.py --store postgres --nats-cluster 3 --runs 50

With ``--store postgres`` the nodes share a database of a PostgreSQL of the run's own
(bench/pg_under_test.py) instead of the SQLite file, and every 4th would-be node kill is
``pg_ctl restart -m immediate`` of that server (every connection dropped mid-transaction,
crash recovery from its WAL) instead of the node kill; ``faults_by_kind`` counts what the
runs struck (node_kill, nats_server_kill, pg_restart, operator_cancel).

With ``--faults`` (``all`` or a comma-separated list of kinds) the runs take turns over the
kinds: the four kill points above, and the faults of bench/faults.py (the clock stepped
+1 h / -1 h, the database file deleted, the disk full, RATCHET_MAIL or RATCHET_SUBMIT
purged), struck at a moment drawn as a kill point is, on one node. The task and the checks
are those of a kill run. Probes submitted over the API while a fault lasts add
``acked_then_lost``: probes the node answered OK that, after the repair (and the restart, if
the node stopped), do not exist or do not settle (SUCCEEDED, FAILED, UNKNOWN,
WAITING_APPROVAL) within 60 s. ``missing_effects`` counts tasks (probes included) that
SUCCEEDED without each claim effective once at the provider, or FAILED with a claim not
refunded. ``runs_by_fault`` says how many runs each kind got, ``faults_seen`` what each
kind saw, ``skipped_faults`` the kinds that cannot run here and why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.faults import FAULT_KINDS, Fault, FaultBed, fault_summary
from bench.nats_under_test import NatsUnderTest, retrying
from bench.nodes import Cluster
from bench.steps import NodeProc
from ratchet.protocol.errors import ErrorCode, RemoteError
from ratchet.protocol.ids import task_id_for
from ratchet.protocol.subjects import partition_of
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.credentials import admin_key_path
from ratchet.testing import FinanceClient, FinanceSimulatorProcess

if TYPE_CHECKING:  # psycopg (a dev extra) only with --store postgres
    from bench.pg_under_test import PgUnderTest

KILL_POINTS = ("before_call", "after_provider_commit", "mid_compensation", "random",
               "rerun_detour", "cancel_during_call")
ALL_KINDS = KILL_POINTS + FAULT_KINDS
PARKED = {"task.unknown", "task.handoff"}
TERMINAL = {"task.succeeded", "task.failed", "task.cancelled"}
#: What to do once a run's task is done (repairs that can wait, the audit of the probes).
Settle = Callable[[], Awaitable[dict[str, Any]]]
#: Strikes a fault (kind, task id, run); returns its Settle, if any.
Strike = Callable[[str, str, int], Awaitable[Settle | None]]


def _node(state_dir: Path, nats_url: str, finance_url: str,
          args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> NodeProc:
    return NodeProc(state_dir, nats_url, app="ratchet.testing.expense:app", log_level="error",
                    args=args,  # the node's default durability (FULL)
                    env={"RATCHET_FINANCE_URL": finance_url,
                         "RATCHET_CHAOS_POST_CALL_PAUSE": "0.1", **(env or {})})


#: A run's task → (status, handoffs, writes still IN_FLIGHT or UNKNOWN), read from the store.
Outcome = Callable[[str], tuple[str | None, int, int]]


def _sqlite_outcome(db: Path) -> Outcome:
    def outcome(task_id: str) -> tuple[str | None, int, int]:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            row = conn.execute("SELECT status FROM tasks WHERE task_id = ?",
                               (task_id,)).fetchone()
            handoffs = conn.execute("SELECT COUNT(*) FROM handoffs WHERE task_id = ?",
                                    (task_id,)).fetchone()[0]
            unsettled = conn.execute(
                "SELECT COUNT(*) FROM actions WHERE task_id = ? AND status IN ('IN_FLIGHT',"
                " 'UNKNOWN') AND accepted = 0 AND kind = 'write'", (task_id,)).fetchone()[0]
        return (row[0] if row else None), handoffs, unsettled

    return outcome


class Nodes:
    """N nodes (ids c1..cN) on one store and one NATS; :meth:`kill_owner` SIGKILLs the node
    that owns a task's partition and starts a replacement before returning.

    The replacement alternates between two paths, so both are covered: on even runs it
    reuses the victim's id — a restarted process, which reclaims its own partitions at once
    (what a process supervisor restarting the node gives); on odd runs it gets a fresh id —
    the victim's partitions stay leased until the lease expires (TTL 5 s), then the
    survivors take them over and recover the tasks (the failover path, with the fencing
    token bumped), and the newcomer later gets its share by rebalancing, which moves tasks
    once more, cleanly.
    """

    def __init__(self, cluster: Cluster, count: int, rng: random.Random) -> None:
        self.cluster = cluster
        self.count = count
        self.rng = rng
        self.owner_kills = 0
        self.fresh_ids = 0

    async def start(self) -> None:
        for slot in range(1, self.count + 1):
            self.cluster.start(f"c{slot}")
        view = self.cluster.view()
        try:
            await self.cluster.balanced(view)
        finally:
            view.close()

    def kill_owner(self, task_id: str, run: int) -> None:
        view = self.cluster.view()
        try:
            owner = view.owners().get(partition_of(task_id))
        finally:
            view.close()
        live = sorted(self.cluster.nodes)
        if owner in live:
            self.owner_kills += 1
            victim = owner
        else:  # between owners (a lease expiring, a hand-over): any node
            victim = self.rng.choice(live)
        self.cluster.kill(victim)
        fresh = run % 2 == 1
        self.fresh_ids += fresh
        self.cluster.start(f"{victim.split('-')[0]}-{run}" if fresh else victim)


def _kill_condition(point: str, event: ratchet.Event) -> bool:
    p = event.payload
    if point == "before_call":
        return event.type == "action.started" and not p.get("compensates")
    if point == "after_provider_commit":
        return event.type == "action.started"
    if point == "mid_compensation":
        return event.type == "action.started" and bool(p.get("compensates"))
    if point == "rerun_detour":
        return event.type == "action.started" and ":hotel:" in str(p.get("key"))
    if point == "cancel_during_call":
        return event.type == "action.started" and not p.get("compensates")
    return False


def _draw(rng: random.Random, kinds: tuple[str, ...] | None, run: int,
          points: tuple[str, ...] = KILL_POINTS) -> tuple[bool, str, str]:
    """(fail, kill point or moment, fault kind). Without ``kinds`` the draws of the plain
    SIGKILL harness, unchanged, so its figures stay comparable. With them, the kinds take
    turns (each gets its share of the runs, also in a short test), a ``mid_compensation``
    kill gets a failing task (which compensates), and a fault other than a kill strikes at
    a moment drawn as a kill point is."""
    if kinds is None:
        fail = rng.random() < 0.35
        point = rng.choice(points if fail else tuple(p for p in points
                                                     if p != "mid_compensation"))
        return fail, point, point
    kind = kinds[run % len(kinds)]
    fail = kind == "mid_compensation" or rng.random() < 0.35
    if kind in KILL_POINTS:
        return fail, kind, kind
    return fail, rng.choice(("before_call", "after_provider_commit", "random")), kind


async def _one_run(run: int, rng: random.Random, strike: Strike,
                   client: ratchet.Client, finance: FinanceClient, outcome: Outcome,
                   kinds: tuple[str, ...] | None = None,
                   points: tuple[str, ...] = KILL_POINTS) -> dict[str, Any]:
    """One task, one fault: ``strike(kind, task_id, run)`` strikes it (a SIGKILL: a node
    killed and replaced) and returns what to do once the task is done (repairs that can
    wait, the audit of the probes)."""
    fail, point, kind = _draw(rng, kinds, run, points)
    report = f"chaos-{run}-{rng.randrange(10**9)}"
    task_id = (await retrying(lambda: client.submit("expense.split", {
        "report_id": report, "employee": "e-1", "travel": 10 + run, "hotel": 20 + run,
        "fail_after_writes": fail, "detour": point == "rerun_detour"}, key=report))).task_id
    killed = False
    settle: Settle | None = None
    events: list[ratchet.Event] = []

    async def watch_and_kill() -> None:
        nonlocal killed, settle
        deadline = time.monotonic() + rng.uniform(0.0, 0.4) if point == "random" else None
        async for event in client.watch(task_id, idle_timeout=30.0):
            events.append(event)
            if not killed and (_kill_condition(point, event) or (
                    deadline is not None and time.monotonic() >= deadline)):
                if point in ("after_provider_commit", "rerun_detour"):
                    await asyncio.sleep(rng.uniform(0.01, 0.09))  # inside the 100 ms pause
                settle = await strike(kind, task_id, run)
                killed = True
            if event.type in TERMINAL | PARKED:
                return

    try:
        await asyncio.wait_for(watch_and_kill(), 60)
    except TimeoutError:
        pass
    if not killed:  # the task ended before the kill point: strike anyway, it must stay done
        settle = await strike(kind, task_id, run)
    after = await settle() if settle is not None else {}
    final = events[-1].type if events else None
    late = await _settled_late(outcome, task_id, point == "cancel_during_call")
    effects = finance.effects()
    keys = {k: effects.get(k, 0) for k in (
        f"claim:{report}:travel:submit", f"claim:{report}:hotel:submit",
        f"refund:{report}:travel", f"refund:{report}:hotel")}
    claims = [keys[f"claim:{report}:travel:submit"], keys[f"claim:{report}:hotel:submit"]]
    refunds = [keys[f"refund:{report}:travel"], keys[f"refund:{report}:hotel"]]
    status, handoffs, unsettled = await asyncio.to_thread(outcome, task_id)
    assert task_id == task_id_for("default", report)
    missing = False
    if status == "SUCCEEDED":
        missing = claims != [1, 1] or refunds != [0, 0]
    elif status in ("FAILED", "CANCELLED"):  # compensated on failure and on cancel
        missing = refunds != claims  # every claim made was refunded
    sequences = [e.sequence for e in events]
    return {
        **after, "kind": kind, "point": point, "fail": fail, "status": status, "final_event": final,
        "lost": status is None or status not in (
            "SUCCEEDED", "FAILED", "UNKNOWN", "WAITING_APPROVAL",
            *(("CANCELLED",) if point == "cancel_during_call" else ())),
        "unsettled": unsettled if status in ("SUCCEEDED", "FAILED", "CANCELLED") else 0,
        "handoff": status in ("UNKNOWN", "WAITING_APPROVAL") and handoffs > 0,
        "double": any(v > 1 for v in keys.values()),
        "missing": missing,
        "gap": sequences != list(range(1, len(sequences) + 1)),
        "late": late,
    }


#: How long a task not settled when its watch ended may still take: past the recovery
#: sweep's interval (``serve --recovery-interval``, 30 s), which restarts a task whose
#: actor is gone without having recorded why (e.g. it gave up while the store was down).
LATE_SETTLE_S = 45.0


async def _settled_late(outcome: Outcome, task_id: str, cancelled: bool) -> bool:
    """Whether the task, not settled when its watch ended, settled within LATE_SETTLE_S
    (counted apart: ``settled_after_watch``); a task that never does is then lost."""
    settled = ("SUCCEEDED", "FAILED", "UNKNOWN", "WAITING_APPROVAL",
               *(("CANCELLED",) if cancelled else ()))
    if (await asyncio.to_thread(outcome, task_id))[0] in settled:
        return False
    deadline = time.monotonic() + LATE_SETTLE_S
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)  # poll pacing under the deadline
        if (await asyncio.to_thread(outcome, task_id))[0] in settled:
            return True
    return False


async def run_chaos(runs: int, seed: int = 7, nodes: int = 1,
                    faults: tuple[str, ...] | None = None,
                    points: tuple[str, ...] = KILL_POINTS,
                    nats_cluster: int = 0, store: str = "sqlite") -> dict[str, Any]:
    """``faults``: the kinds each run draws from (kill points and bench/faults.py's
    FAULT_KINDS; those that cannot run here are skipped), on one node; None: SIGKILLs
    only, on ``nodes`` nodes, as the harness always did. ``nats_cluster`` (> 1): NATS is
    that many servers, one SIGKILLed with each node kill. ``store`` "postgres": the nodes
    share a PostgreSQL database, and every 4th kill restarts PostgreSQL (``-m immediate``)
    instead of killing a node (bench/pg_under_test.py)."""
    unknown = (set(faults or ()) - set(ALL_KINDS)) | (set(points) - set(KILL_POINTS))
    if unknown or (faults is not None and (nodes != 1 or nats_cluster > 1
                                           or store != "sqlite")):
        raise ValueError(f"unknown fault kinds {sorted(unknown)}, or faults on several nodes"
                         " or servers or on PostgreSQL")
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="ratchet-chaos-") as tmp, \
            FinanceSimulatorProcess() as sim:
        base = Path(tmp)
        nats = NatsUnderTest(base, nats_cluster)
        pg = None
        if store == "postgres":
            from bench.pg_under_test import PgUnderTest

            pg = PgUnderTest()
            await asyncio.to_thread(pg.start)
        url = await nats.start()
        finance = FinanceClient(sim.url)
        bed = FaultBed(base, url, sim.url) if faults is not None else None
        harness = _Harness(base, url, sim.url, nodes, seed, bed, nats, pg)
        results = []
        try:
            client = await harness.start()
            strike = harness.striker(client, finance)
            kinds = None if bed is None or faults is None else tuple(
                k for k in faults if k not in bed.skipped)
            for run in range(runs):
                results.append(await _one_run(run, rng, strike, client, finance,
                                              harness.outcome, kinds, points))
        finally:
            await harness.stop()
            await nats.stop()
            if pg is not None:
                pg.close()
    kills: dict[str, int] = {}
    for r in results:
        kills[r["point"]] = kills.get(r["point"], 0) + 1
    cluster = harness.cluster
    extra = {} if cluster is None else {"kills_of_task_owner": cluster.owner_kills,
                                        "fresh_id_replacements": cluster.fresh_ids}
    summary = {
        "nodes": nodes,
        "runs": len(results),
        "succeeded": sum(r["status"] == "SUCCEEDED" for r in results),
        "failed_and_compensated": sum(r["status"] == "FAILED" and not r["missing"]
                                      for r in results),
        "cancelled_and_compensated": sum(r["status"] == "CANCELLED" and not r["missing"]
                                         for r in results),
        "unknown_with_handoff": sum(r["handoff"] for r in results),
        "lost_tasks": sum(r["lost"] for r in results),
        "double_effects": sum(r["double"] for r in results),
        "missing_effects": sum(r["missing"] for r in results),
        "event_gaps": sum(r["gap"] for r in results),
        "settled_after_watch": sum(r["late"] for r in results),
        "unsettled_actions_after_run": sum(r["unsettled"] for r in results),
        "kill_points": kills,
        **extra,
        **nats.summary(),
        **(pg.summary() if pg is not None else {}),
        "faults_by_kind": {**harness.faults, **(
            {"nats_server_kill": nats.kills} if nats.cluster is not None else {})},
    }
    if bed is not None:
        summary = fault_summary(summary, results, bed.skipped)
    return summary


class _Harness:
    """The node(s) a run strikes: one node (SIGKILLs), a cluster (SIGKILLs of a task's
    owner) or the fault bed (every kind)."""

    def __init__(self, base: Path, url: str, finance_url: str, nodes: int, seed: int,
                 bed: FaultBed | None, nats: NatsUnderTest,
                 pg: PgUnderTest | None = None) -> None:
        self.bed, self.nats, self.pg = bed, nats, pg
        #: What each strike did: node_kill, pg_restart, operator_cancel, or a fault kind.
        self.faults: Counter[str] = Counter()
        store_env = {"RATCHET_STORE": pg.url} if pg is not None else {}
        self.node: NodeProc | None = None
        self.cluster: Nodes | None = None
        self.client: ratchet.Client | None = None
        self.url = url
        if bed is not None:
            self.node, self.db = bed.node, bed.db
        elif nodes == 1:
            self.node = _node(base / "node", url, finance_url, nats.node_args, store_env)
            self.db = base / "node" / "ratchet.db"
        else:
            # Its own generator: the runs draw the same kill points as with one node.
            self.cluster = Nodes(Cluster(base, url, ("--writer", "thread", *nats.node_args),
                                         app="ratchet.testing.expense:app", log_level="error",
                                         env={"RATCHET_FINANCE_URL": finance_url,
                                              "RATCHET_CHAOS_POST_CALL_PAUSE": "0.1"},
                                         store_url=pg.url if pg is not None else None),
                                 nodes, random.Random(seed + 1))
            self.db = self.cluster.cluster.db
        self.outcome: Outcome = pg.outcome if pg is not None else _sqlite_outcome(self.db)

    async def start(self) -> ratchet.Client:
        if self.node is not None:
            self.node.start()
        if self.cluster is not None:
            await self.cluster.start()
        self.client = await ratchet.Client.connect(self.url, "default",
                                                   creds=admin_key_path(self.db.parent))
        return self.client

    def striker(self, client: ratchet.Client, finance: FinanceClient) -> Strike:
        async def strike(kind: str, task_id: str, run: int) -> Settle | None:
            if kind == "cancel_during_call":  # an operator's cancel, not a kill
                try:
                    await client.request_admin("cancel", {
                        "command_id": f"chaos-cancel-{run}", "task_id": task_id,
                        "args": {"reason": "chaos"}})
                except RemoteError as e:
                    if e.code != ErrorCode.ILLEGAL_TRANSITION:
                        raise
                    # The task finished before the cancel reached its node: it must stay so.
                    self.faults["operator_cancel_too_late"] += 1
                    return None
                self.faults["operator_cancel"] += 1
                return None
            if kind not in KILL_POINTS:
                assert self.bed is not None
                fault = Fault(kind, self.bed, client, finance, run)
                await fault.strike(task_id, run)
                self.faults[kind] += 1
                return fault.settle
            if self.pg is not None and self.pg.takes_turn():
                await self.pg.strike()  # the database crashes and recovers; no node killed
                self.faults["pg_restart"] += 1
                return None
            self.faults["node_kill"] += 1
            await self.nats.strike(run)  # on a cluster: one NATS server goes too
            # A kill blocks the loop while the node restarts, as it always has.
            if self.cluster is not None:
                self.cluster.kill_owner(task_id, run)
            else:
                assert self.node is not None
                self.node.kill()
                self.node.start()
            return None

        return strike

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.bed is not None:
            self.bed.close()
        elif self.node is not None:
            self.node.stop()
        if self.cluster is not None:
            self.cluster.cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=1,
                        help="nodes sharing the store and NATS (each run kills one)")
    parser.add_argument("--nats-cluster", type=int, default=0, metavar="N",
                        help="NATS as N servers, R=N (each run SIGKILLs one too)")
    parser.add_argument("--faults", default=None, metavar="all|KIND,...",
                        help="each run draws one of these fault kinds (all: "
                             + ", ".join(ALL_KINDS) + "; one node; bench/faults.py)."
                             " Default: the SIGKILL points, as before")
    parser.add_argument("--points", default=",".join(KILL_POINTS), metavar="POINT,...",
                        help="the kill points runs draw from (default: all of "
                             + ", ".join(KILL_POINTS) + ")")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite",
                        help="postgres: the nodes share a PostgreSQL of the run's own, and"
                             " every 4th kill restarts it (-m immediate) instead")
    args = parser.parse_args()
    faults = None if args.faults is None else ALL_KINDS if args.faults == "all" else tuple(
        args.faults.split(","))
    if faults is not None and (args.nodes != 1 or args.nats_cluster > 1
                               or args.store != "sqlite" or not set(faults) <= set(ALL_KINDS)):
        parser.error(f"--faults takes kinds among {', '.join(ALL_KINDS)}, on one node, one NATS")
    configure_logging("error")
    points = tuple(args.points.split(","))
    if not set(points) <= set(KILL_POINTS):
        parser.error(f"--points takes kill points among {', '.join(KILL_POINTS)}")
    print(json.dumps(asyncio.run(run_chaos(args.runs, args.seed, args.nodes, faults, points,
                                           args.nats_cluster, args.store))))


if __name__ == "__main__":
    main()
