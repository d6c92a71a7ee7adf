"""Files that vanish or refuse under a running node (issue 17): the database file deleted,
the disk full with the log on it. Real `ratchet serve` processes, real files."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

import ratchet
from ratchet.protocol.errors import RemoteError
from tests.conftest import NodeProcess, wait_terminal

pytestmark = pytest.mark.slow  # real node processes


async def _submit(client: ratchet.Client, key: str) -> tuple[str, str]:
    """("ok", task id), (error code, key), or ("none", key) when nobody answered."""
    try:
        result = await client.submit_sync("three", {}, key)
    except RemoteError as exc:
        return exc.wire_code, key
    except Exception:  # no responders, a timeout: the node is gone or going
        return "none", key
    return "ok", str(result["task_id"])


async def test_a_database_deleted_under_a_running_node_stops_it_and_loses_no_acknowledged_task(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    tmp_path: Path,
) -> None:
    node = node_process(nats_url)
    await asyncio.to_thread(node.start)
    assert node.proc is not None
    acked = []
    for i in range(18):
        kind, task_id = await _submit(client, f"before-{i}")
        assert kind == "ok", kind
        acked.append(task_id)
    db = tmp_path / "node" / "ratchet.db"
    for suffix in ("", "-wal", "-shm"):  # what `rm .ratchet/ratchet.db*` does
        Path(f"{db}{suffix}").unlink(missing_ok=True)

    # Keep submitting until the node has gone (bounded): it must notice and refuse.
    outcomes: list[tuple[str, str]] = []
    deadline = asyncio.get_running_loop().time() + 30.0
    while node.proc.poll() is None and asyncio.get_running_loop().time() < deadline:
        outcomes.append(await _submit(client, f"after-{len(outcomes)}"))
        if outcomes[-1][0] != "ok":
            await asyncio.sleep(0.02)  # pacing while it stops, not a wait for a condition
    code = await asyncio.to_thread(node.proc.wait, 30)
    assert code == 1, "the node exits non-zero once its database file is gone"

    kinds = [kind for kind, _ in outcomes]
    refused = [k for k in kinds if k != "ok"]
    assert refused and set(refused) <= {"UNAVAILABLE", "none"}, kinds
    # Once refused (UNAVAILABLE, or no API any more: the node stops within milliseconds
    # of noticing), never acknowledged again.
    assert "ok" not in kinds[kinds.index(refused[0]):], "acknowledged after the node noticed"
    acked += [task_id for kind, task_id in outcomes if kind == "ok"]
    assert db.exists(), "the data of the open file was put back at its path"

    # Every task acknowledged (before the node noticed) is there after a restart, and runs.
    await asyncio.to_thread(node.start)
    for task_id in acked:
        events = await wait_terminal(client, task_id, timeout=60)
        assert events[-1].type == "task.succeeded", (task_id, events[-1])
    assert node.interrupt() == 0
