"""What traces cost: durable steps a second with tracing off and on. Prints one JSON object
as its last line.

- steps_per_s_tracing_off / _on: the median over runs of one task of 1,000 trivial durable
  steps (``seq1000``: task.started → task.succeeded, timestamps recorded by the node), on a
  ``ratchet serve`` node started without, then with ``--otel``; the rounds alternate (off,
  on, off, on) so that drift of the machine falls on both;
- tracing_cost_pct: how much slower on is than off (target: under 10 %);
- off_spread_pct: (max - min) / median of the off runs — the noise floor a cost below
  which is not measurable here;
- otlp_requests / otlp_bytes: what the traced nodes sent, so "on" is known to have
  traced: its spans go over OTLP/HTTP (the real exporter, batched, on its own thread) to a
  sink in this process that answers 200 and drops them.

Needs the ``otel`` extra (``opentelemetry-exporter-otlp-proto-http``; ``make install``
has it). The node is a real ``ratchet serve`` subprocess joined to a real nats-server.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.steps import NodeProc
from ratchet.supervisors.cli import configure_logging

PAIRS = 16  # tasks of each kind on each node, alternating off, on, off, on ...
#: (workflow, traced): seq1000's steps do nothing; tool1000's make one tool call each.
_KINDS = [(w, traced) for w in ("seq1000", "tool1000") for traced in (False, True)]


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace endpoint that keeps nothing: counts requests and spans' bytes."""

    requests = 0
    body_bytes = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        with _Sink.lock:
            _Sink.requests += 1
            _Sink.body_bytes += length
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


async def _one_task(node: NodeProc, client: ratchet.Client,
                    workflow: str) -> tuple[float, float]:
    """One task of 1,000 steps: its steps a second (the node's own timestamps) and the
    node process's CPU seconds a step."""
    cpu = node.cpu_seconds()
    task_id = (await client.submit(workflow, {}, key=f"{workflow}-{time.time_ns()}")).task_id
    events = [e async for e in client.watch(task_id, idle_timeout=120)]
    assert events[-1].type == "task.succeeded", events[-1]
    started = next(e for e in events if e.type == "task.started").occurred_at
    return 1000 / (events[-1].occurred_at - started), (node.cpu_seconds() - cpu) / 1000


async def main() -> None:
    configure_logging("warning")
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
    except ImportError:
        print(json.dumps({"error": "needs opentelemetry-exporter-otlp-proto-http"
                          " (pip install 'ratchet-runtime[otel]')"}))
        raise SystemExit(1) from None
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    rates: dict[tuple[str, bool], list[float]] = {k: [] for k in _KINDS}
    cpu: dict[tuple[str, bool], list[float]] = {k: [] for k in _KINDS}
    with tempfile.TemporaryDirectory(prefix="ratchet-tracing-") as tmp:
        # Two nodes, each with its own embedded NATS and store, up at once: tasks alternate
        # between them, so the load of a shared machine falls on both alike.
        nodes = {traced: NodeProc(
            Path(tmp) / ("on" if traced else "off"), None, args=("--otel",) if traced else (),
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench"}
            if traced else {"OTEL_SDK_DISABLED": "true"}) for traced in (False, True)}
        clients: dict[bool, ratchet.Client] = {}
        try:
            for traced, node in nodes.items():
                node.start()
                assert node.url is not None
                clients[traced] = await ratchet.Client.connect(node.url, "bench",
                                                               creds=node.creds)
            for _ in range(PAIRS):
                for workflow, traced in _KINDS:
                    rate, seconds = await _one_task(nodes[traced], clients[traced], workflow)
                    rates[workflow, traced].append(rate)
                    cpu[workflow, traced].append(seconds)
        finally:
            for client in clients.values():
                await client.close()
            for node in nodes.values():
                node.stop()  # the traced node flushes its last spans as it stops
            sink.shutdown()
    print(json.dumps({**_figures(rates, cpu, "seq1000", ""),
                      **_figures(rates, cpu, "tool1000", "tool_step_"),
                      "otlp_requests": _Sink.requests, "otlp_bytes": _Sink.body_bytes,
                      "tasks_each": PAIRS}))


def _figures(rates: dict[tuple[str, bool], list[float]], cpu: dict[tuple[str, bool], list[float]],
             workflow: str, prefix: str) -> dict[str, Any]:
    off, on = rates[workflow, False], rates[workflow, True]
    off_median, on_median = statistics.median(off), statistics.median(on)
    # Means, not medians: /proc counts CPU in 10 ms ticks, 10 µs a step of one task, and
    # a sum over all the tasks has the finer resolution.
    cpu_off = statistics.fmean(cpu[workflow, False])
    cpu_on = statistics.fmean(cpu[workflow, True])
    return {
        f"{prefix}steps_per_s_tracing_off": round(off_median, 1),
        f"{prefix}steps_per_s_tracing_on": round(on_median, 1),
        f"{prefix}tracing_cost_pct": round(100 * (off_median - on_median) / off_median, 1),
        f"{prefix}off_spread_pct": round(100 * (max(off) - min(off)) / off_median, 1),
        f"{prefix}node_cpu_us_per_step_off": round(cpu_off * 1e6, 1),
        f"{prefix}node_cpu_us_per_step_on": round(cpu_on * 1e6, 1),
        f"{prefix}tracing_cpu_cost_pct": round(100 * (cpu_on - cpu_off) / cpu_off, 1),
    }


if __name__ == "__main__":
    asyncio.run(main())
