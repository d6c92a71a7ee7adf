"""Regression corpora (issue 15, item 2): recorded tasks exported with ``ratchet export`` and
replayed together against a candidate (``ratchet replay --corpus``, and
``ratchet.testing.replay_corpus`` from a test), with a summary per workflow; secrets stay
sealed in the export file."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import ratchet
from ratchet.actors.agents.openai_model import OpenAICompatibleModel
from ratchet.actors.replay import read_recordings
from ratchet.testing import FinanceClient, replay_corpus
from ratchet.testing.model_stub_process import ModelStubProcess
from tests import secret_apps
from tests.conftest import RATCHET_BIN, ROOT, NodeFactory, wait_terminal
from tests.replay_apps import CALLS, REPORT, claim_workflow, registry

REPORTS = ["R-1", "R-2", "R-3"]


@pytest.fixture(scope="module")
def stub() -> Iterator[ModelStubProcess]:
    with ModelStubProcess() as s:
        yield s


def _ratchet(state: Path, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RATCHET_BIN), "--state-dir", str(state), "--output", "json",
                           "--log-level", "warning", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **_STORE, **(env or {})})


#: The store the commands read: the node's PostgreSQL database under
#: RATCHET_TEST_STORE=postgres (as ``serve`` finds it, $RATCHET_STORE), else the state dir's.
_STORE: dict[str, str] = {}


def _uses_store_of(node: ratchet.Node) -> None:
    _STORE.clear()
    if node.config.store:
        _STORE["RATCHET_STORE"] = node.config.store


async def test_a_corpus_replays_against_a_candidate_and_sums_up_its_divergences(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
    stub: ModelStubProcess, tmp_path: Path
) -> None:
    stub.reset()
    stub.script([{"tool_calls": [{"name": "lookup_policy", "arguments": {"category": "travel"}}]},
                 {"content": json.dumps({"category": "travel", "limit": 500.0})}] * 3)
    model = OpenAICompatibleModel(stub.url, "gpt-test", timeout=5)
    node = await start_node(registry(model, finance.base_url))
    for n, report_id in enumerate(REPORTS):
        finance.add_faults([{"op": "claims", "mode": "drop_after_commit",
                             "key": f"claim:{report_id}:b:submit"}])
        task_id = (await client.submit("replay.claim", {**REPORT, "report_id": report_id},
                                       key=f"c-{n}")).task_id
        assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    await node.stop()
    _uses_store_of(node)
    state, corpus = tmp_path / "node", tmp_path / "claims.rtc"
    exported = _ratchet(state, "export", "--out", str(corpus), "--workflow", "replay.claim",
                        "--status", "SUCCEEDED", "--since", "1d")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["exported"] == 3
    assert len(list(read_recordings(corpus))) == 3
    calls, asked = dict(CALLS), len(stub.requests())

    same = await replay_corpus(corpus, registry(model, finance.base_url), state_dir=state)
    assert same.ok and len(same.reports) == 3
    assert same.table() == [{"workflow": "replay.claim", "version": 1, "tasks": 3,
                             "steps": 21, "divergent_tasks": 0, "divergences": {}}]

    candidate = registry(model, finance.base_url, claim_workflow(model), claim_workflow(
        model, 2, factor=2.0, route="done", prompt="What is the meals limit?"))
    changed = await replay_corpus(corpus, candidate, state_dir=state, version=2)
    assert not changed.ok
    assert changed.table() == [{"workflow": "replay.claim", "version": 2, "tasks": 3,
                                "steps": 21, "divergent_tasks": 3, "divergences": {
                                    "tool_request": 3, "route": 3, "model_request": 3}}]
    assert dict(CALLS) == calls and len(stub.requests()) == asked

    # The command line: an export file, and a query of the store (opened read-only).
    env = {"RATCHET_TEST_STUB_URL": stub.url, "RATCHET_FINANCE_URL": finance.base_url}
    app = ("--app", "tests.replay_cli_app:app")
    from_file = _ratchet(state, "replay", "--corpus", str(corpus), *app, env=env)
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout)["tasks"] == 3
    queried = _ratchet(state, "replay", "--corpus", "workflow=replay.claim,status=SUCCEEDED",
                       "--version", "2", *app, env=env)
    assert queried.returncode == 1
    summary = json.loads(queried.stdout)
    assert summary["tasks"] == 3 and summary["divergences"] == 9
    bad = _ratchet(state, "replay", "--corpus", "colour=blue", *app, env=env)
    assert bad.returncode == 2 and "query" in bad.stderr


async def test_an_export_keeps_secrets_sealed_and_replays_with_the_stores_key(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path
) -> None:
    secret = "sk-live-4242-corpus"
    node = await start_node(secret_apps.app)
    task_id = (await client.submit("signup", secret_apps.SignupInput(
        customer="c1", api_key=ratchet.SecretStr(secret)), key="s-1")).task_id
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    await node.stop()
    _uses_store_of(node)
    seen = len(secret_apps.SEEN)
    state, corpus = tmp_path / "node", tmp_path / "signup.rtc"
    exported = _ratchet(state, "export", "--out", str(corpus), "--task", task_id)
    assert exported.returncode == 0, exported.stderr
    assert secret.encode() not in corpus.read_bytes()

    report = await replay_corpus(corpus, secret_apps.app, state_dir=state)
    assert report.ok, report.to_dict()
    assert len(secret_apps.SEEN) == seen  # the charge was answered by the ledger
    assert secret not in json.dumps(report.to_dict(), default=str)
