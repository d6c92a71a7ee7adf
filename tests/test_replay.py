"""Sandboxed replay (issue 15, item 1): a task recorded on a real node — a read, a write, a
write dropped after commit and reconciled, a choice, an agent on the model stub — is run
again in process from its history (actors/replay/), with no call to the finance provider
or the model, no write to the store and nothing published."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest

import ratchet
from ratchet.actors.agents.openai_model import OpenAICompatibleModel
from ratchet.actors.replay import read_recordings, read_task, replay_recording
from ratchet.actors.transport.subscribed import subscriptions_registered
from ratchet.supervisors.cli.replay_store import open_history
from ratchet.testing import FinanceClient, replay
from ratchet.testing.model_stub_process import ModelStubProcess
from tests.conftest import RATCHET_BIN, ROOT, NodeFactory, wait_terminal
from tests.replay_apps import CALLS, REPORT, claim_workflow, registry

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def stub() -> Iterator[ModelStubProcess]:
    with ModelStubProcess() as s:
        yield s


def _script(stub: ModelStubProcess) -> None:
    stub.reset()
    stub.script([{"tool_calls": [{"name": "lookup_policy", "arguments": {"category": "travel"}}]},
                 {"content": json.dumps({"category": "travel", "limit": 500.0})}])


async def _record(start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
                  stub: ModelStubProcess) -> tuple[str, Any, ratchet.Node]:
    """Run one task of ``replay.claim`` v1 on a node; its id, the model it used, the node."""
    _script(stub)
    model = OpenAICompatibleModel(stub.url, "gpt-test", timeout=5)
    finance.add_faults([{"op": "claims", "mode": "drop_after_commit",
                         "key": "claim:R-7:b:submit"}])
    node = await start_node(registry(model, finance.base_url))
    # A token budget: each model request carries the max_tokens what is left allows
    task_id = (await client.submit("replay.claim", REPORT, key="rp-1",
                                   budget={"tokens": 50_000})).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded", events[-1]
    kinds = [e.type for e in events]
    assert "action.read" in kinds and "action.unknown" in kinds and "action.reconciled" in kinds
    return task_id, model, node


def _store(node: ratchet.Node) -> str | Path:
    """The store the node used: its PostgreSQL URL (RATCHET_TEST_STORE=postgres), else its
    SQLite file; replay and export read either."""
    return node.config.store or node.config.db_path


def _digest(state_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(state_dir.glob("ratchet.db*")) if p.is_file()}


async def test_a_recorded_task_replays_with_no_divergence_and_no_provider_call(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
    stub: ModelStubProcess, tmp_path: Path
) -> None:
    task_id, model, node = await _record(start_node, client, finance, stub)
    calls, effects, asked = dict(CALLS), finance.effects(), len(stub.requests())
    assert calls["submit_claim"] == 2 and calls["lookup_claim"] == 1 and asked == 2

    report = await replay(task_id, registry(model, finance.base_url), state_dir=tmp_path / "node",
                          store=_store(node))

    assert report.ok, json.dumps(report.to_dict()["divergences"], default=str)
    assert [(s.step, s.kind, s.outcome) for s in report.steps] == [
        ("lookup", "step", "same"), ("claim_a", "step", "same"), ("claim_b", "step", "same"),
        ("route", "choice", "same"), ("assistant", "agent", "same"),
        ("assistant", "agent", "same"), ("done", "step", "same")]
    # lookup_claim, two claims, the agent's two model calls and its lookup_policy read
    assert report.answered == 6 and report.live_reads == 0
    assert dict(CALLS) == calls and finance.effects() == effects
    assert len(stub.requests()) == asked

    # --until stops after a checkpoint; a read with no recorded answer diverges, and goes
    # live only when asked (writes and the model are still answered by the recording).
    app = registry(model, finance.base_url)
    with open_history(_store(node)) as conn:
        recording = read_task(conn, task_id)
    assert len((await replay_recording(recording, app, until=3)).steps) == 3
    recording.reads.clear()
    blind = await replay_recording(recording, app)
    assert [(d.kind, d.step) for d in blind.divergences] == [
        ("unrecorded", "lookup"), ("unrecorded", "assistant")]
    live = await replay_recording(recording, app, live_reads=True)
    assert live.live_reads == 2  # and the provider answers as it does today: the claim is there
    assert [(d.kind, d.step, d.detail["diff"]["changed"]) for d in live.divergences] == [
        ("state", "lookup", [["seen", False, True]])]
    assert CALLS["lookup_claim"] == calls["lookup_claim"] + 1
    assert CALLS["lookup_policy"] == calls["lookup_policy"] + 1
    assert finance.effects() == effects and len(stub.requests()) == asked


async def test_a_changed_workflow_reports_each_divergence_with_its_step_and_diff(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
    stub: ModelStubProcess, tmp_path: Path
) -> None:
    task_id, model, node = await _record(start_node, client, finance, stub)
    calls, asked = dict(CALLS), len(stub.requests())
    candidate = registry(model, finance.base_url, claim_workflow(model), claim_workflow(
        model, 2, factor=2.0, route="done", prompt="What is the meals limit?"))

    report = await replay(task_id, candidate, state_dir=tmp_path / "node", version=2,
                          store=_store(node))

    assert not report.ok and report.replayed_version == 2
    found = {(d.kind, d.step): d.to_dict() for d in report.divergences}
    assert set(found) == {("tool_request", "claim_a"), ("route", "route"),
                          ("model_request", "assistant")}
    tool = found[("tool_request", "claim_a")]
    assert tool["tool"] == "submit_claim" and tool["fields"] == {"amount": [120.0, 240.0]}
    assert (found[("route", "route")]["recorded"], found[("route", "route")]["replayed"]) == (
        "assistant", "done")
    model_diff = found[("model_request", "assistant")]
    assert model_diff["messages"]["changed"] == [
        ["1.content", "What is the travel limit?", "What is the meals limit?"]]
    assert "conversation" in model_diff["fields"]
    by_step = {s.checkpoint: s.outcome for s in report.steps}
    assert by_step == {1: "same", 2: "different", 3: "same", 4: "different",
                       5: "different", 6: "skipped", 7: "same"}
    assert dict(CALLS) == calls and len(stub.requests()) == asked

    # The command line says the same, and exits 1 (0 only when nothing diverged).
    env = {"RATCHET_TEST_STUB_URL": stub.url, "RATCHET_FINANCE_URL": finance.base_url}
    store = ("--store", str(_store(node)))
    same = _cli(tmp_path, env, task_id, *store)
    assert same.returncode == 0, same.stderr
    changed = _cli(tmp_path, env, task_id, "--version", "2", *store)
    assert changed.returncode == 1
    answer = json.loads(changed.stdout.splitlines()[-1])
    assert answer["replay"] is True and len(answer["divergences"]) == 3


def _cli(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RATCHET_BIN), "--state-dir", str(tmp_path / "node"), "--output", "json",
         "--log-level", "warning", "replay", *args, "--app", "tests.replay_cli_app:app"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def _export_cli(state: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RATCHET_BIN), "--state-dir", str(state), "--output", "json", "export",
         "--out", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


async def test_replay_never_writes_the_store_and_never_publishes(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
    stub: ModelStubProcess, tmp_path: Path, nats_url: str
) -> None:
    task_id, model, node = await _record(start_node, client, finance, stub)
    nc = await nats.connect(nats_url)
    seen: list[str] = []

    async def heard(msg: Any) -> None:
        seen.append(msg.subject)

    state_dir = tmp_path / "node"
    with open_history(_store(node)) as conn:
        with pytest.raises((sqlite3.OperationalError, psycopg.errors.ReadOnlySqlTransaction),
                           match=r"readonly|read-only|query_only"):
            conn.execute("DELETE FROM tasks")
        recording = read_task(conn, task_id)
    await node.stop()  # the store closed: its files stay as they are unless written
    before = _digest(state_dir)
    sub = await nc.subscribe(">", cb=heard)
    await subscriptions_registered(nc)
    candidate = registry(model, finance.base_url, claim_workflow(model), claim_workflow(
        model, 2, factor=2.0))
    for version in (1, 2):
        await replay_recording(recording, candidate, version=version)
        await replay(task_id, candidate, state_dir=state_dir, version=version,
                     store=_store(node))
    await nc.flush()  # anything published before it has reached ``heard`` by now
    assert seen == [] and _digest(state_dir) == before
    await sub.unsubscribe()
    await nc.close()



async def test_replay_and_export_read_a_postgresql_store_read_only(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
    stub: ModelStubProcess, tmp_path: Path, pg_url: str
) -> None:
    async def on_pg(registry: ratchet.Registry, **config: Any) -> ratchet.Node:
        return await start_node(registry, store=pg_url, **config)

    task_id, model, node = await _record(on_pg, client, finance, stub)
    await node.stop()
    app = registry(model, finance.base_url)
    report = await replay(task_id, app, state_dir=tmp_path / "node", store=pg_url)
    assert report.ok and report.answered == 6, report.to_dict()["divergences"]
    with open_history(pg_url) as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="read-only"):
            conn.execute("DELETE FROM tasks")

    # The command line finds the same store in $RATCHET_STORE, as `serve` does.
    env = {"RATCHET_TEST_STUB_URL": stub.url, "RATCHET_FINANCE_URL": finance.base_url,
           "RATCHET_STORE": pg_url}
    same = _cli(tmp_path, env, task_id)
    assert same.returncode == 0, same.stderr
    out = tmp_path / "claims.rtc"
    exported = _export_cli(tmp_path / "elsewhere", out, "--workflow", "replay.claim",
                           "--store", pg_url)
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout.splitlines()[-1])["exported"] == 1
    assert [r.task[0] for r in read_recordings(out)] == [task_id]
    corpus = _cli(tmp_path, env, "--corpus", str(out))
    assert corpus.returncode == 0, corpus.stderr
    assert json.loads(corpus.stdout.splitlines()[-1])["tasks"] == 1
