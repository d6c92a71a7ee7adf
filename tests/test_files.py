"""Files that vanish or refuse under a running node (issue 17): the database file deleted,
the disk full with the log on it. Real `ratchet serve` processes, real files."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ratchet
from bench.faults import fill
from ratchet.protocol.auth import read_key_file, write_key_file
from ratchet.protocol.errors import RemoteError
from ratchet.supervisors.node.credentials import admin_key_path
from tests.conftest import ROOT, NodeProcess, node_key, wait_terminal

pytestmark = pytest.mark.slow  # real node processes


async def _submit(client: ratchet.Client, key: str) -> tuple[str, str]:
    """("ok", task id), (error code, key), or ("none", key) when nobody answered."""
    try:
        result = await client.submit_sync("three", {}, key)
    except RemoteError as exc:
        return exc.wire_code, key
    except Exception:  # no responders, a timeout: the node is gone or going
        return "none", key
    return "ok", result.task_id


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


class _LoggedNode(NodeProcess):
    """A node whose log (stderr) goes to a file, here on the same small disk as its state."""

    def __init__(self, state_dir: Path, nats_url: str, log_path: Path, key: Path) -> None:
        super().__init__(state_dir, nats_url, {}, log_level="info")
        self.log_path = log_path
        # Its local admin key is the ``client`` fixture's (``key``), which it grants at start.
        write_key_file(admin_key_path(state_dir), read_key_file(key))

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env,
                                         stdout=subprocess.PIPE, stderr=log_file)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert b"serving" in line, line


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _tmpfs(tmp_path / "disk", "8m")


@pytest.fixture
def disk_64m(tmp_path: Path) -> Iterator[Path]:
    yield from _tmpfs(tmp_path / "disk", "64m")


def _tmpfs(disk: Path, size: str) -> Iterator[Path]:
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


async def _submit_until_ok(client: ratchet.Client, key: str, seconds: float) -> str:
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        kind, task_id = await _submit(client, key)
        if kind == "ok":
            return task_id
        assert kind == "UNAVAILABLE", kind
        assert asyncio.get_running_loop().time() < deadline, "did not resume"
        await asyncio.sleep(0.1)  # pacing the retries, as a client would


async def test_a_full_disk_under_the_log_and_the_store_refuses_work_and_resumes_when_freed(
    nats_url: str, client: ratchet.Client, small_disk: Path,
) -> None:
    node = _LoggedNode(small_disk / "node", nats_url, small_disk / "node.log",
                       node_key(small_disk.parent))
    await asyncio.to_thread(node.start)
    assert node.proc is not None
    try:
        acked = [(await client.submit_sync("three", {}, f"k-{i}")).task_id for i in range(20)]
        for task_id in acked:
            assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"

        filler = small_disk / "filler"
        await asyncio.to_thread(fill, filler)
        # The node keeps answering: retry later, never silence. A few submits may still fit
        # in WAL pages the file already holds (they are durable, and kept below); once a
        # write needs a new block, every answer is UNAVAILABLE.
        refused = 0
        for i in range(400):
            kind, value = await _submit(client, f"full-{i}")
            assert kind in ("ok", "UNAVAILABLE"), kind
            if kind == "ok":
                acked.append(value)
                continue
            refused += 1
            if refused == 5:
                break
        assert refused == 5
        assert (await client.get(acked[0])).status == "SUCCEEDED"  # reads go on
        assert node.proc.poll() is None

        filler.unlink()  # space returns: the node goes on by itself
        task_id = await _submit_until_ok(client, "after-free", seconds=30)
        assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
        acked.append(task_id)

        # A stop on a full disk leaves a store the next start opens whole.
        await asyncio.to_thread(fill, filler)
        assert await asyncio.to_thread(node.interrupt) == 0
        filler.unlink()
        await asyncio.to_thread(node.start)
        for task_id in acked:  # those accepted while the disk was full too
            events = await wait_terminal(client, task_id, timeout=60)
            assert events[-1].type == "task.succeeded", (task_id, events[-1])
        assert await asyncio.to_thread(node.interrupt) == 0
    finally:
        if node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait()


async def test_a_stop_on_a_full_disk_keeps_a_multi_mb_wal_whole(
    nats_url: str, client: ratchet.Client, disk_64m: Path,
) -> None:
    """The closing checkpoint cannot run on a full disk: the WAL (several MB of committed
    work not yet in the database file) must stay whole and be replayed by the next start."""
    node = _LoggedNode(disk_64m / "node", nats_url, disk_64m / "node.log",
                       node_key(disk_64m.parent))
    await asyncio.to_thread(node.start)
    assert node.proc is not None
    try:
        pad = "x" * 100_000
        acked = [(await client.submit_sync("three", {"pad": pad}, f"w-{i}")).task_id
                 for i in range(40)]
        for task_id in acked:
            assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
        wal = disk_64m / "node" / "ratchet.db-wal"
        assert wal.stat().st_size > 2 * 1024 * 1024, wal.stat().st_size
        filler = disk_64m / "filler"
        await asyncio.to_thread(fill, filler)
        assert await asyncio.to_thread(node.interrupt) == 0
        filler.unlink()
        await asyncio.to_thread(node.start)
        for task_id in acked:
            snapshot = await client.get(task_id)
            assert snapshot.status == "SUCCEEDED", (task_id, snapshot.status)
        assert await asyncio.to_thread(node.interrupt) == 0
    finally:
        if node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait()
