"""A node's observability port (``serve --metrics-port``): /metrics after real tasks ran,
/healthz and /readyz, ``serve``'s bounded wait to be ready, and the alert rules file
checked against what a real node exports (docs/operations.md: Metrics, Health, Alerts)."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import ratchet
from ratchet.supervisors.cli.common import ExitCode
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.supervisors.observability import Observability
from ratchet.testing.expense import app as expense_app
from ratchet.testing.finance_client import FinanceClient
from tests.agent_apps import app as agent_app
from tests.apps import app
from tests.conftest import ROOT, NodeProcess, wait_terminal
from tests.test_actions import REPORT, wait_terminal_or_parked
from tests.test_poison import dead_letter

ALERTS = ROOT / "docs" / "examples" / "alerts.yml"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.text()


def _samples(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def _exported_names(text: str) -> set[str]:
    """Every series name the exposition declares (a family with no sample yet included)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            if kind == "counter":  # declared with its _total, or without it
                names |= {name if name.endswith("_total") else f"{name}_total"}
            elif kind == "histogram":
                names |= {name + s for s in ("_bucket", "_count", "_sum")}
            else:
                names.add(name)
    return names


async def _until_status(url: str, status: int, timeout: float) -> str:
    """Poll ``url`` (another component's truth) until it answers ``status``, bounded."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got, body = await _get(url)
        if got == status:
            return body
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{url} still answers {got} after {timeout} s: {body}")
        await asyncio.sleep(0.1)


async def test_a_served_node_exports_its_tasks_steps_retries_commits_and_leases(
        nats_url: str, client: ratchet.Client,
        node_process: Callable[..., NodeProcess]) -> None:
    port = _free_port()
    node = node_process(nats_url, args=("--metrics-port", str(port)))
    node.start()  # its "serving" line: ready
    handles = [await client.submit("three", {}, key=f"k{i}") for i in range(3)]
    handles.append(await client.submit("three", {"fail_once_at": 0}, key="retried"))
    for handle in handles:
        events = await wait_terminal(client, handle.task_id)
        assert events[-1].type == "task.succeeded"

    status, text = await _get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    samples = _samples(text)
    assert _value(samples, "ratchet_tasks", tenant="acme", status="SUCCEEDED") == 4
    assert _value(samples, "ratchet_tasks_finished_total", tenant="acme",
                  status="SUCCEEDED") == 4
    # three steps and the finish, in each of the four tasks; the failed attempt did not commit
    assert _value(samples, "ratchet_step_seconds_count", tenant="acme") == 16
    assert _value(samples, "ratchet_retries_total", tenant="acme", kind="step",
                  error_class="RuntimeError") == 1
    assert _value(samples, "ratchet_leases_held") == 16
    assert _value(samples, "ratchet_lease_changes_total", change="acquired") == 16
    assert _value(samples, "ratchet_commit_seconds_count") > 0
    assert _value(samples, "ratchet_node_ready") == 1
    assert _value(samples, "ratchet_admission_queue_depth") == 0
    assert _value(samples, "ratchet_dead_letters") == 0
    assert _value(samples, "ratchet_fenced_writes_total", where="store") == 0
    mail = {dict(labels)["consumer"] for (name, labels) in samples
            if name == "ratchet_jetstream_consumer_pending"
            and dict(labels)["stream"] == "RATCHET_MAIL"}
    assert mail == {f"mail-{p}" for p in range(16)}

    assert (await _get(f"http://127.0.0.1:{port}/healthz"))[0] == 200
    status, body = await _get(f"http://127.0.0.1:{port}/readyz")
    assert status == 200 and '"ready": true' in body
    assert node.interrupt() == 0


@pytest.mark.slow
async def test_readyz_says_not_ready_while_nats_is_gone_and_ready_again_when_it_is_back(
        tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats-server")
    url = await server.start()
    node = ratchet.Node(ratchet.NodeConfig(state_dir=tmp_path / "node", nats_url=url,
                                           drain_timeout=1.0), app)
    observed = Observability(node, port=0)
    await observed.start()
    try:
        await node.start()
        observed.watch()
        await _until_status(f"{observed.url}/readyz", 200, timeout=10)
        await server.stop()
        body = await _until_status(f"{observed.url}/readyz", 503, timeout=15)
        assert '"nats": {"ok": false' in body
        assert (await _get(f"{observed.url}/healthz"))[0] == 200  # the process is still up
        samples = _samples((await _get(f"{observed.url}/metrics"))[1])
        assert _value(samples, "ratchet_nats_connected") == 0
        assert _value(samples, "ratchet_node_ready") == 0
        await server.start()
        await _until_status(f"{observed.url}/readyz", 200, timeout=15)
    finally:
        await node.stop()
        await observed.stop()
        await server.stop()


@pytest.mark.slow
async def test_serve_exits_not_ready_when_it_gets_no_lease_within_its_ready_timeout(
        tmp_path: Path, nats_url: str, start_node: Any,
        node_process: Callable[..., NodeProcess]) -> None:
    # Another node holds every partition and hands none over before its next tick.
    await start_node(node_id="holder", lease_ttl=120.0, lease_interval=60.0, writer="thread")
    late = node_process(nats_url, args=("--node-id", "late", "--writer", "thread",
                                        "--ready-timeout", "1"))
    done = await asyncio.to_thread(subprocess.run, late.args, cwd=ROOT, env=late.env,
                                   capture_output=True, timeout=60)
    assert done.returncode == ExitCode.NOT_READY, done.stderr
    assert b"not ready within --ready-timeout 1 s: leases: none held yet" in done.stderr
    assert b'"code": "NOT_READY"' in done.stdout


async def test_every_alert_rule_uses_only_metrics_a_node_exports(
        tmp_path: Path, nats_url: str) -> None:
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"]
             for rule in group["rules"]]
    assert {r["alert"] for r in rules} >= {
        "RatchetUnknownActionOld", "RatchetHandoffOld", "RatchetTaskStuckRunning",
        "RatchetDeadLettersGrowing", "RatchetCrashLoopStop", "RatchetFencedWrites",
        "RatchetLeaseFlapping", "RatchetBudgetExhaustionRate"}
    node = ratchet.Node(ratchet.NodeConfig(state_dir=tmp_path / "node", nats_url=nats_url), app)
    observed = Observability(node, port=0)
    await observed.start()
    try:
        await node.start()
        status, text = await _get(f"{observed.url}/metrics")
    finally:
        await node.stop()
        await observed.stop()
    assert status == 200
    exported = _exported_names(text)
    for rule in rules:
        assert rule["annotations"]["summary"] and rule["labels"]["severity"]
        used = set(re.findall(r"\bratchet_[a-z_]+\b", rule["expr"]))
        assert used, rule["alert"]
        assert used <= exported, (rule["alert"], used - exported)


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian: apt-get install prometheus)")
def test_promtool_accepts_the_alert_rules() -> None:
    done = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert b"SUCCESS: 12 rules found" in done.stdout


async def test_metrics_show_an_unknown_action_its_handoff_retries_spend_and_a_dead_letter(
        start_node: Any, client: ratchet.Client, finance: FinanceClient,
) -> None:
    node = await start_node(expense_app)
    observed = Observability(node, port=0)
    await observed.start()
    try:
        observed.watch()
        finance.add_faults([{"op": "claims", "mode": "drop_after_commit"},
                            {"op": "query", "mode": "status_500", "times": 50}])
        events = await wait_terminal_or_parked(
            client, (await client.submit("expense.agent", REPORT, key="r-1")).task_id)
        assert events[-1].type == "task.unknown"
        await client.js.publish("ratchet.submit.acme", b"\xc1 not msgpack")
        await dead_letter(client, "ratchet.dlq.submit.acme")
        samples = _samples((await _get(f"{observed.url}/metrics"))[1])
    finally:
        await observed.stop()
    assert _value(samples, "ratchet_tasks", tenant="acme", status="UNKNOWN") == 1
    assert _value(samples, "ratchet_unknown_actions_open", tenant="acme") == 1
    assert _value(samples, "ratchet_handoffs_open", tenant="acme") == 1
    assert _value(samples, "ratchet_handoffs_oldest_seconds", tenant="acme") >= 0
    assert _value(samples, "ratchet_actions_unknown_total", tenant="acme") == 1
    assert _value(samples, "ratchet_handoffs_total", tenant="acme") == 1
    action_retries = {dict(labels)["error_class"]: v for (name, labels), v in samples.items()
                      if name == "ratchet_retries_total" and dict(labels)["kind"] == "action"}
    assert sum(action_retries.values()) == sum(e.type == "action.retry" for e in events) > 0
    assert _value(samples, "ratchet_dlq_stream_messages") == 1
    assert _value(samples, "ratchet_dead_letters") == 1


async def test_metrics_show_what_a_tenants_agents_spent_and_a_budget_exhausted(
        start_node: Any, client: ratchet.Client) -> None:
    node = await start_node(agent_app)
    observed = Observability(node, port=0)
    await observed.start()
    try:
        observed.watch()
        task_id = (await client.submit("agent.spender", {"category": "travel"}, key="spend",
                                       budget={"model_calls": 2})).task_id
        events = await wait_terminal(client, task_id)
        assert any(e.type == "agent.budget_exhausted" for e in events)
        spent = (await node.store.load_task(task_id)).spent
        samples = _samples((await _get(f"{observed.url}/metrics"))[1])
    finally:
        await observed.stop()
    assert spent["tokens"] > 0 and spent["money"] > 0, spent
    assert _value(samples, "ratchet_model_tokens_spent", tenant="acme") == spent["tokens"]
    assert _value(samples, "ratchet_model_money_spent", tenant="acme") == spent["money"]
    assert _value(samples, "ratchet_budget_exhausted_total", tenant="acme") == 1


async def test_a_draining_node_holds_no_lease_on_purpose_and_stays_ready(
        tmp_path: Path, nats_url: str) -> None:
    node = ratchet.Node(ratchet.NodeConfig(state_dir=tmp_path / "node", nats_url=nats_url,
                                           node_id="drained", lease_interval=0.2), app)
    observed = Observability(node, port=0)
    await observed.start()
    try:
        await node.start()
        assert node.store is not None
        assert await node.store.set_node_status("drained", "draining")  # what `admin drain` does
        deadline = asyncio.get_running_loop().time() + 15
        while node.leases is not None and node.leases.held:  # handed over at the next ticks
            assert asyncio.get_running_loop().time() < deadline, "still holding leases"
            await asyncio.sleep(0.1)
        status, body = await _get(f"{observed.url}/readyz")
        samples = _samples((await _get(f"{observed.url}/metrics"))[1])
    finally:
        await node.stop()
        await observed.stop()
    assert status == 200, body
    assert "none held on purpose (draining)" in body
    assert _value(samples, "ratchet_leases_held") == 0
    assert _value(samples, "ratchet_lease_changes_total", change="dropped") == 16
    assert _value(samples, "ratchet_node_ready") == 1
