"""State a step returns must be plain data of bounded size (issue 17): anything else fails
the step on its first attempt with INVALID_STATE_VALUE, recorded as ``step.failed``, not a
crash loop ending in "restart intensity exceeded"."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import ratchet
from bench.large_values import run as run_large_value
from ratchet.persistence.checkpoints import StateTracker
from ratchet.protocol.errors import InvalidStateValue
from tests.conftest import NodeFactory, wait_terminal

RUNS: Counter[str] = Counter()
MiB = 1024 * 1024


def _returning(name: str, make: Any) -> ratchet.Workflow:
    wf = ratchet.Workflow(name, version=1)

    async def produce(ctx: ratchet.StepContext) -> dict[str, Any]:
        RUNS[name] += 1
        return dict(make())

    async def after(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"ok": True}}

    wf.add_step("produce", produce)
    wf.add_step("after", after)
    return wf


app = ratchet.Registry([
    _returning("unencodable", lambda: {"fine": 1, "bad": object()}),
    _returning("too_deep", lambda: {"deep": _nest(2000)}),  # past msgpack's packer
    _returning("big_value", lambda: {"blob": "x" * (2 * MiB)}),
    _returning("big_checkpoint", lambda: {"a": b"a" * (MiB // 2), "b": b"b" * (MiB // 2),
                                          "c": b"c" * (MiB // 2)}),
])


def _nest(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("workflow", "names"), [
    ("unencodable", ["'bad'", "object"]), ("too_deep", ["'deep'", "list"]),
    ("big_value", ["'blob'", "2097152 bytes"]), ("big_checkpoint", ["exceed 1048576 bytes"]),
])
async def test_a_step_returning_state_that_cannot_be_checkpointed_fails_at_once(
    start_node: NodeFactory, client: ratchet.Client, workflow: str, names: list[str]
) -> None:
    RUNS.clear()
    await start_node(app, max_value_mb=1.0, max_checkpoint_mb=1.0)
    task_id = (await client.submit(workflow, {}, key=workflow)).task_id
    events = await wait_terminal(client, task_id)
    [failed] = [e for e in events if e.type == "step.failed"]
    error = failed.payload["error"]
    assert error["code"] == "INVALID_STATE_VALUE" and failed.payload["attempt"] == 1
    assert all(n in error["message"] for n in names), error["message"]
    assert events[-1].type == "task.failed"
    assert events[-1].payload["error"]["code"] == "INVALID_STATE_VALUE"
    assert events[-1].payload["reason"] == "invalid state value"
    assert RUNS[workflow] == 1  # not run again: the same value would come back
    assert "task.recovered" not in [e.type for e in events]


def test_a_refused_diff_leaves_the_baseline_as_it_was() -> None:
    tracker = StateTracker(max_value_bytes=100, max_checkpoint_bytes=150)
    tracker.diff({"a": 1})
    with pytest.raises(InvalidStateValue) as info:
        tracker.diff({"a": 2, "b": "y" * 101})  # the str refused before it is encoded
    assert info.value.details == {"key": "b", "size": 101, "limit": 100}
    with pytest.raises(InvalidStateValue):
        tracker.diff({"a": 2, "b": "y" * 80, "c": "z" * 80})
    with pytest.raises(InvalidStateValue):
        tracker.diff({"a": 2**70})  # past msgpack's integers
    assert [v.key for v in tracker.diff({"a": 2}).values] == ["a"]  # "a" still changed


@pytest.mark.parametrize("kind", ["str", "text", "list"])
async def test_a_step_returning_a_15_mib_value_peaks_under_two_and_a_half_copies_of_it(
    kind: str
) -> None:
    # A real `ratchet serve` process (bench/large_values.py): its VmHWM, reset just before
    # the submit, against its VmRSS then. Before the value was written in chunks from
    # one encoding: ~6 copies (137 MB for 15 MiB on a 45 MB node).
    figures = await run_large_value(15.0, kind, None, restart=False)
    assert figures["outcome"] == "task.succeeded", figures
    assert figures["copies"] <= 2.5, figures


async def test_a_node_recovering_a_task_with_a_15_mib_value_peaks_under_two_and_a_half_copies(
) -> None:
    figures = await run_large_value(15.0, "str", None, restart=True)  # SIGKILL, restart
    assert figures["outcome"] == "task.succeeded", figures
    assert figures["copies"] <= 2.5, figures
