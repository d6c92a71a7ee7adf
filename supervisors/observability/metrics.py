"""``/metrics``: a node's figures in Prometheus' text format (docs/operations.md, "Metrics").

Everything is gathered at scrape time, the way a custom Prometheus collector works: the
store's grouped counts (persistence/metric_rows.py), the node's in-memory state (admission
queue, leases, commit latency buckets), what :class:`EventFigures` counted as commits went
by, and JetStream's consumer and stream info. Nothing here is on a task's path; the one
thing that is (EventFigures) is a dictionary bump per event.

The scrape is asynchronous (the store and NATS are), so the families are built first and
handed to prometheus-client's exposition through a one-shot collector.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence

import structlog
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ratchet.persistence.writer import COMMIT_BUCKETS
from ratchet.protocol.states import TERMINAL
from ratchet.protocol.subjects import (
    STREAM_DECISIONS,
    STREAM_DLQ,
    STREAM_EXTERNAL,
    STREAM_MAIL,
    STREAM_SUBMIT,
)
from ratchet.supervisors.node.node import Node
from ratchet.supervisors.observability.event_figures import STEP_BUCKETS, EventFigures
from ratchet.supervisors.observability.health import readiness

__all__ = ["CONTENT_TYPE_LATEST", "scrape"]

#: The streams whose durable consumers (the routers: mail per partition, intake per
#: tenant, external and decision routers) are reported with their lag.
_ROUTED = (STREAM_MAIL, STREAM_SUBMIT, STREAM_EXTERNAL, STREAM_DECISIONS)
#: A scrape does not wait longer than this for NATS (a NATS outage must not hang it).
NATS_TIMEOUT = 2.0
_TERMINAL = {s.value for s in TERMINAL}

log = structlog.get_logger("ratchet.metrics")


class _Families:
    """A collector that yields families built beforehand (generate_latest's argument)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


async def scrape(node: Node, events: EventFigures) -> bytes:
    """The text of one scrape of ``node``."""
    families: list[Metric] = []
    families += _node_families(node)
    families += _event_families(events)
    if node.store is not None:
        try:
            families += await _store_families(node)
        except Exception as exc:  # closing, or its file lost: the node's own figures still go
            log.warning("store figures not read for this scrape", error=repr(exc))
    if node.bus is not None and node.bus.nc.is_connected:
        with contextlib.suppress(Exception):  # absent this scrape; ratchet_nats_connected says why
            families += await asyncio.wait_for(_nats_families(node), NATS_TIMEOUT)
    return generate_latest(_Families(families))


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def _histogram(name: str, doc: str, labels: Sequence[str], bounds: Sequence[float],
               series: Iterable[tuple[list[str], list[int], float]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, counts, total in series:
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, bounds), "+Inf"], counts, strict=True):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        family.add_metric(values, buckets, total)
    return family


def _node_families(node: Node) -> list[Metric]:
    ready = readiness(node)
    info = _gauge("ratchet_node_info", "This node (always 1)", ["node_id"])
    info.add_metric([node.config.node_id], 1)
    up = _gauge("ratchet_node_ready", "1 when /readyz says ready")
    up.add_metric([], 1 if ready.ready else 0)
    nats = _gauge("ratchet_nats_connected", "1 while the node's NATS connection is up")
    nats.add_metric([], 1 if ready.checks.get("nats", (False, ""))[0] else 0)
    families: list[Metric] = [info, up, nats]
    if node.tasks is not None:
        scheduler = node.scheduler
        queued = _gauge("ratchet_admission_queue_depth",
                        "Tasks waiting for a running slot on this node (fair admission)")
        queued.add_metric([], scheduler.queued)
        running = _gauge("ratchet_running_tasks", "Tasks holding a running slot on this node")
        running.add_metric([], scheduler.running)
        families += [queued, running]
    leases = node.leases
    if leases is not None:
        held = _gauge("ratchet_leases_held", "Partition leases this node holds")
        held.add_metric([], len(leases.held))
        changes = _counter("ratchet_lease_changes", "Partition leases taken and let go"
                           " (lost, handed over, released) by this node", ["change"])
        for change, n in leases.holding.changes.items():
            changes.add_metric([change], n)
        families += [held, changes]
    fenced = _counter("ratchet_fenced_writes", "Task writes refused for a fencing token no"
                      " longer current: by this node before the write (node), or by the"
                      " store in the write's transaction (store)", ["where"])
    fenced.add_metric(["node"], leases.fenced_writes if leases is not None else 0)
    fenced.add_metric(["store"], node.store.fenced_refused if node.store is not None else 0)
    families.append(fenced)
    if node.store is not None:
        stats = node.store.writer_stats
        families.append(_histogram(
            "ratchet_commit_seconds", "Duration of each group commit (one SQLite transaction"
            " batch)", [], COMMIT_BUCKETS, [([], stats.commit_buckets, stats.commit_sum)]))
    return families


def _event_families(events: EventFigures) -> list[Metric]:
    steps = _histogram("ratchet_step_seconds", "Duration of each step that committed",
                       ["tenant"], STEP_BUCKETS,
                       [([t], h.counts, h.total) for t, h in events.step_seconds.items()])
    retries = _counter("ratchet_retries", "Failed attempts by error class: a step that"
                       " raised (kind=step; error code or type) or a tool call retried"
                       " (kind=action; the retry decision)", ["tenant", "kind", "error_class"])
    for (tenant, kind, error_class), n in events.retries.items():
        retries.add_metric([tenant, kind, error_class], n)
    finished = _counter("ratchet_tasks_finished", "Tasks that reached a terminal state",
                        ["tenant", "status"])
    for (tenant, status), n in events.finished.items():
        finished.add_metric([tenant, status], n)
    families: list[Metric] = [steps, retries, finished]
    for name, doc in (("budget_exhausted", "Agent budgets spent (or max_turns reached)"),
                      ("crash_loop_stops", "Tasks the crash-loop guard handed to a human"),
                      ("actions_unknown", "Actions whose outcome became UNKNOWN"),
                      ("handoffs", "Tasks handed to a human (UNKNOWN or WAITING_APPROVAL)")):
        family = _counter(f"ratchet_{name}", doc, ["tenant"])
        for (counted, tenant), n in events.counted.items():
            if counted == name:
                family.add_metric([tenant], n)
        families.append(family)
    return families


def _with_age(name: str, doc: str, rows: dict[str, tuple[int, float]]) -> list[Metric]:
    count = _gauge(f"ratchet_{name}_open", f"{doc} open now", ["tenant"])
    age = _gauge(f"ratchet_{name}_oldest_seconds", f"Age of the oldest of the {doc} open",
                 ["tenant"])
    for tenant, (n, oldest) in rows.items():
        count.add_metric([tenant], n)
        age.add_metric([tenant], oldest)
    return [count, age]


async def _store_families(node: Node) -> list[Metric]:
    assert node.store is not None
    figures = await node.store.metric_figures(node.clock.now())
    tasks = _gauge("ratchet_tasks", "Tasks in the store by tenant and status",
                   ["tenant", "status"])
    stuck = _gauge("ratchet_task_status_oldest_seconds", "Seconds since the least recently"
                   " changed unfinished task of this tenant and status last changed",
                   ["tenant", "status"])
    for (tenant, status), (n, oldest) in sorted(figures.tasks.items()):
        tasks.add_metric([tenant, status], n)
        if status not in _TERMINAL:
            stuck.add_metric([tenant, status], oldest)
    dead = _gauge("ratchet_dead_letters", "Rows of the store's dead_letters table")
    dead.add_metric([], figures.dead_letters)
    tokens = _gauge("ratchet_model_tokens_spent", "Model tokens spent by the tenant's tasks"
                    " the store holds", ["tenant"])
    money = _gauge("ratchet_model_money_spent", "Money spent on models by the tenant's tasks"
                   " the store holds", ["tenant"])
    for tenant, dims in sorted(figures.spent.items()):
        tokens.add_metric([tenant], dims.get("tokens", 0.0))
        money.add_metric([tenant], dims.get("money", 0.0))
    return [tasks, stuck, dead, tokens, money,
            *_with_age("unknown_actions", "UNKNOWN actions", figures.unknown_actions),
            *_with_age("handoffs", "handoffs", figures.handoffs)]


async def _nats_families(node: Node) -> list[Metric]:
    assert node.bus is not None
    js = node.bus.js
    pending = _gauge("ratchet_jetstream_consumer_pending", "Messages not yet delivered to a"
                     " router's durable consumer (its lag)", ["stream", "consumer"])
    unacked = _gauge("ratchet_jetstream_consumer_ack_pending", "Messages delivered to a"
                     " router's consumer and not yet acknowledged", ["stream", "consumer"])
    for stream, infos in zip(_ROUTED, await asyncio.gather(
            *(js.consumers_info(s) for s in _ROUTED), return_exceptions=True), strict=True):
        if isinstance(infos, BaseException):
            continue  # that stream does not exist (yet): nothing routed from it
        for info in infos:
            name = info.name or (info.config.durable_name if info.config else None) or "?"
            pending.add_metric([stream, name], info.num_pending or 0)
            unacked.add_metric([stream, name], info.num_ack_pending or 0)
    dlq = _gauge("ratchet_dlq_stream_messages", "Messages in the dead-letter stream")
    state = (await js.stream_info(STREAM_DLQ)).state
    dlq.add_metric([], state.messages)
    return [pending, unacked, dlq]

