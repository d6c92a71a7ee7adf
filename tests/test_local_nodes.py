"""A client of the same OS user connects to a local node's embedded NATS without being told
the key (actors/transport/local_nodes.py), and ``submit``'s handle is also the task id."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

import ratchet
from ratchet.actors.transport import local_nodes
from ratchet.protocol.errors import Unauthenticated
from tests.conftest import RATCHET_BIN, ROOT


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "registry"
    monkeypatch.setenv(local_nodes.REGISTRY_ENV, str(folder))
    monkeypatch.delenv(local_nodes.CREDS_ENV, raising=False)
    return folder


def _key(tmp_path: Path, name: str = "local-admin.nk", mode: int = 0o600) -> Path:
    key = tmp_path / name
    key.write_text("SUAKEY")
    key.chmod(mode)
    return key


def test_an_entry_is_found_for_its_loopback_url_only(registry: Path, tmp_path: Path) -> None:
    key = _key(tmp_path)
    entry = local_nodes.register("nats://127.0.0.1:4333", key, os.getpid())
    assert entry is not None and entry.stat().st_mode & 0o777 == 0o600
    assert registry.stat().st_mode & 0o777 == 0o700
    assert local_nodes.discover_creds("nats://127.0.0.1:4333") == key.resolve()
    assert local_nodes.discover_creds("nats://localhost:4333") == key.resolve()
    assert local_nodes.discover_creds("nats://127.0.0.1:4334") is None
    # a cluster list: the first loopback server with an entry
    assert local_nodes.discover_creds("nats://10.0.0.9:4333,nats://127.0.0.1:4333") == \
        key.resolve()
    assert local_nodes.register("nats://10.0.0.9:4333", key, os.getpid()) is None


def test_a_shared_entry_or_key_is_not_trusted(registry: Path, tmp_path: Path) -> None:
    key = _key(tmp_path)
    entry = local_nodes.register("nats://127.0.0.1:4335", key, os.getpid())
    assert entry is not None
    entry.chmod(0o644)  # someone else could have written it: ignored
    assert local_nodes.discover_creds("nats://127.0.0.1:4335") is None
    entry.chmod(0o600)
    key.chmod(0o640)
    assert local_nodes.discover_creds("nats://127.0.0.1:4335") is None


def test_ratchet_creds_comes_first_and_only_the_writer_unregisters(
        registry: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = _key(tmp_path)
    local_nodes.register("nats://127.0.0.1:4336", key, os.getpid())
    monkeypatch.setenv(local_nodes.CREDS_ENV, "/elsewhere/ops.nk")
    assert local_nodes.discover_creds("nats://127.0.0.1:4336") == Path("/elsewhere/ops.nk")
    monkeypatch.delenv(local_nodes.CREDS_ENV)
    local_nodes.unregister("nats://127.0.0.1:4336", os.getpid() + 1)
    assert local_nodes.discover_creds("nats://127.0.0.1:4336") == key.resolve()
    local_nodes.unregister("nats://127.0.0.1:4336", os.getpid())
    assert local_nodes.discover_creds("nats://127.0.0.1:4336") is None


def test_a_handle_is_its_task_id() -> None:
    handle = ratchet.TaskHandle("tsk_1", "acme", "k-1", source=None)  # type: ignore[arg-type]
    assert handle == "tsk_1" and {"tsk_1": 1}[handle] == 1 and f"{handle}" == "tsk_1"
    assert type(handle.task_id) is str and handle.tenant == "acme" and handle.key == "k-1"
    assert "tenant='acme'" in repr(handle)
    with pytest.raises(AttributeError):
        handle.key = "other"  # type: ignore[misc]


async def _submit_and_watch_without_creds(url: str, empty_registry: Path) -> None:
    client = await ratchet.Client.connect(url, "acme")  # no creds given
    try:
        handle = await client.submit("expense.report", {"items": [
            {"what": "taxi", "amount": 30}]}, key="r-1")
        events = [e async for e in client.watch(handle, idle_timeout=30)]
        assert events[-1].type == "task.succeeded" and events[-1].task_id == handle
    finally:
        await client.close()
    with pytest.MonkeyPatch.context() as elsewhere:  # no entry, no key: refused
        elsewhere.setenv(local_nodes.REGISTRY_ENV, str(empty_registry))
        with pytest.raises(Unauthenticated):
            await ratchet.Client.connect(url, "acme")


@pytest.mark.slow
def test_a_client_without_creds_reaches_a_local_serve(registry: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    serve = subprocess.Popen(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", "serve",
         "--app", "examples.report:app"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, local_nodes.REGISTRY_ENV: str(registry)})
    try:
        assert serve.stdout is not None
        url = json.loads(serve.stdout.readline())["nats_url"]
        asyncio.run(_submit_and_watch_without_creds(url, tmp_path / "empty"))
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 0
        assert not list(registry.glob("*.json")), "the node left its entry behind"
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
