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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ratchet
from bench.steps import NodeProc, sequential
from ratchet.supervisors.cli import configure_logging

PAIRS = 10  # seq1000 tasks on each node, alternating off, on, off, on ...


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


async def _one_task(node: NodeProc, client: ratchet.Client) -> tuple[float, float]:
    """One seq1000 task: its steps a second (the node's own timestamps) and the node
    process's CPU seconds a step."""
    cpu = node.cpu_seconds()
    rate = (await sequential(client, runs=1))["sequential_steps_per_s"]
    return float(rate), (node.cpu_seconds() - cpu) / 1000


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
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
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
                for traced in (False, True):
                    rate, seconds = await _one_task(nodes[traced], clients[traced])
                    rates[traced].append(rate)
                    cpu[traced].append(seconds)
        finally:
            for client in clients.values():
                await client.close()
            for node in nodes.values():
                node.stop()  # the traced node flushes its last spans as it stops
            sink.shutdown()
    off, on = rates[False], rates[True]
    off_median, on_median = statistics.median(off), statistics.median(on)
    cpu_off, cpu_on = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(json.dumps({
        "steps_per_s_tracing_off": round(off_median, 1),
        "steps_per_s_tracing_on": round(on_median, 1),
        "tracing_cost_pct": round(100 * (off_median - on_median) / off_median, 1),
        "off_spread_pct": round(100 * (max(off) - min(off)) / off_median, 1),
        "node_cpu_us_per_step_off": round(cpu_off * 1e6, 1),
        "node_cpu_us_per_step_on": round(cpu_on * 1e6, 1),
        "tracing_cpu_cost_pct": round(100 * (cpu_on - cpu_off) / cpu_off, 1),
        "otlp_requests": _Sink.requests, "otlp_bytes": _Sink.body_bytes,
        "tasks_each": PAIRS,
    }))


if __name__ == "__main__":
    asyncio.run(main())
