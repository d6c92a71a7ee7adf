"""Web console figures of one node. Prints one JSON object (last line).

- console_task_page_ms: the 99th percentile of 100 loads of a task page (HTML complete:
  summary, graph SVG, pending approval, ledger, checkpoints, events), logged in, over HTTP
  on loopback, for a task waiting for approval, while 200 tasks run (20 steps of 200 ms
  each) and 200 more wait for approval; also the median, and the task list's median;
- the node is a real ``ratchet serve --console-port 0`` subprocess joined to a real
  nats-server; the login is the one a user makes (a challenge signed with a keyring key).

bench/admin.py calls :func:`page_figures` too, on its own node with 500 tasks running.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp

import ratchet
from bench.steps import NodeProc, percentile, publish_submit
from ratchet.protocol.auth import Signer
from ratchet.protocol.ids import task_id_for
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.console import login_code
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

_CHALLENGE = re.compile(r'id="challenge"\s+value="([^"]+)"')


async def _login(http: aiohttp.ClientSession, signer: Signer, node_id: str) -> None:
    async with http.get("/login") as page:
        found = _CHALLENGE.search(await page.text())
    assert found, "no challenge on the login page"
    code = login_code(signer, found.group(1), node_id)
    async with http.post("/login", data={"challenge": found.group(1), "code": code},
                         allow_redirects=False) as answer:
        assert answer.status == 303, await answer.text()


async def _timed(http: aiohttp.ClientSession, path: str, times: int) -> list[float]:
    took = []
    for _ in range(times):
        started = time.perf_counter()
        async with http.get(path) as page:
            body = await page.text()
        took.append((time.perf_counter() - started) * 1000)
        assert page.status == 200 and "</html>" in body, (page.status, body[:300])
    return took


async def page_figures(node: NodeProc, task_id: str, loads: int = 100) -> dict[str, Any]:
    """Log in to ``node``'s console with its local admin key and time the task page of
    ``task_id`` and the task list."""
    url, node_id = node.serving["console"], node.serving["serving"]
    async with aiohttp.ClientSession(base_url=url,
                                     cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        await _login(http, Signer.from_file(node.creds), node_id)
        page = await _timed(http, f"/tasks/{task_id}", loads)
        listing = await _timed(http, "/tasks", 20)
    return {"console_task_page_ms": round(percentile(sorted(page), 0.99), 2),
            "console_task_page_p50_ms": round(statistics.median(page), 2),
            "console_task_list_p50_ms": round(statistics.median(listing), 2)}


async def main() -> None:
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="ratchet-console-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        url = await server.start()
        node = NodeProc(Path(tmp) / "node", url, app="bench.graph_app:app",
                        args=("--console-port", "0"))
        node.start()
        client = await ratchet.Client.connect(url, "bench", creds=node.creds)
        try:
            waits = [await publish_submit(client, "parked", f"parked-{i}") for i in range(200)]
            runs = [await publish_submit(client, "busy", f"busy-{i}") for i in range(200)]
            await asyncio.gather(*waits, *runs)
            target = task_id_for("bench", "parked-0")
            async for event in client.watch(target, idle_timeout=60):
                if event.type == "approval.requested":
                    break
            figures = await page_figures(node, target)
        finally:
            await client.close()
            node.stop()
            await server.stop()
    print(json.dumps({**figures, "waiting_tasks": 200, "running_tasks": 200}))


if __name__ == "__main__":
    asyncio.run(main())
