"""A tool worker written in Node.js (tests/node_tool_worker.js: the npm packages ``nats``
and ``@msgpack/msgpack``, installed from the npm registry into a temp dir) serves tools to
a Ratchet node: a workflow calls them; the worker dies after the effect and before its
reply, and the action is reconciled by query, effective once at the finance simulator."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ratchet
from ratchet.testing import FinanceClient, FinanceSimulatorProcess
from tests import tool_apps
from tests.conftest import ROOT, NodeFactory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node_modules() -> Iterator[Path]:
    """A temp dir with the worker's npm packages; the tests skip, saying why, if npm is
    missing or cannot install them."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not on PATH")
    folder = Path(tempfile.mkdtemp(prefix="ratchet-node-worker-"))
    try:
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", "nats@2",
             "@msgpack/msgpack@3"], cwd=folder, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install of nats and @msgpack/msgpack took over 300 s")
    if done.returncode != 0:
        pytest.skip(f"npm could not install nats and @msgpack/msgpack: {done.stderr[-500:]}")
    shutil.copy(ROOT / "tests" / "node_tool_worker.js", folder / "worker.js")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


class NodeWorker:
    def __init__(self, folder: Path, nats_url: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(["node", "worker.js", nats_url, "acme"], cwd=folder,
                                     env={**os.environ, **env}, stdout=subprocess.PIPE)

    async def ready(self, timeout: float = 30.0) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        assert line, "the Node.js worker exited before serving"
        info: dict[str, object] = json.loads(line)
        return info


@pytest.fixture
def node_worker(node_modules: Path) -> Iterator[Callable[..., NodeWorker]]:
    workers: list[NodeWorker] = []

    def factory(nats_url: str, env: dict[str, str] | None = None) -> NodeWorker:
        w = NodeWorker(node_modules, nats_url, env or {})
        workers.append(w)
        return w

    yield factory
    for w in workers:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


async def test_a_workflow_calls_a_tool_served_by_a_node_js_worker(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client,
        node_worker: Callable[..., NodeWorker]) -> None:
    await start_node(tool_apps.app)
    worker = node_worker(nats_url)
    assert (await worker.ready())["serving"] == ["echo", "pay"]

    handle = await client.submit("remote.echo", {"text": "from node"}, key="js-echo")

    assert await handle.result(timeout=30) == {"text": "from node", "pid": worker.proc.pid}


async def test_a_node_js_worker_killed_between_effect_and_reply_is_reconciled_once(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
        simulator: FinanceSimulatorProcess, node_worker: Callable[..., NodeWorker]) -> None:
    await start_node(tool_apps.app)
    env = {"RATCHET_FINANCE_URL": simulator.url}
    dying = node_worker(nats_url, {**env, "RATCHET_TOOL_DIE_AFTER_EFFECT": "1"})
    await dying.ready()

    handle = await client.submit("remote.pay", {"invoice": "js-1"}, key="js-pay")
    assert await asyncio.wait_for(asyncio.to_thread(dying.proc.wait), 30) == -signal.SIGKILL
    assert finance.effects() == {"invoice:js-1:pay": 1}
    await node_worker(nats_url, env).ready()  # answers the node's query

    output = await handle.result(timeout=60)

    assert output["provider_id"].startswith("clm")
    assert finance.effects() == {"invoice:js-1:pay": 1}
    types = [e.type async for e in client.watch(handle.task_id, idle_timeout=5)]
    assert "action.unknown" in types and "action.reconciled" in types, types
