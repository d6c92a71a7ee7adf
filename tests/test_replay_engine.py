"""The replay engine on recordings built by hand (no node): a loop's route, state diffs,
an export file's round trip, and a node the candidate no longer has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

import ratchet
from ratchet import END
from ratchet.actors.replay import Recording, read_recordings, replay_recording, write_recordings
from ratchet.actors.replay.history import Checkpoint
from ratchet.protocol.errors import UsageError
from ratchet.supervisors.cli.replay import corpus_recordings

#: (node left, node moved to, the state after it)
MOVES = [("begin", "count", {"n": 0}), ("count", "count", {"n": 1}),
         ("count", "count", {"n": 2}), ("count", "done", {"n": 3}),
         ("done", END, {"n": 3, "output": {"n": 3}})]


def loopy(version: int = 1, goal: int = 3, rename: bool = False) -> ratchet.Workflow:
    wf = ratchet.Workflow("loopy", version=version)

    @wf.step(name="start" if rename else "begin")
    async def begin(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"n": 0}

    @wf.loop(until=lambda s: s["n"] >= goal, max_iterations=5, next="done")
    async def count(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"n": ctx.state["n"] + 1}

    @wf.step(next=END)
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"n": ctx.state["n"]}}

    return wf


def recording(moves: list[tuple[str, str, dict[str, Any]]] = MOVES) -> Recording:
    """A task of ``loopy`` v1 as the store would hold it (values as deltas, msgpack)."""
    pack = msgpack.packb
    values: list[tuple[str, int, bytes | None, str | None, int]] = []
    before: dict[str, Any] = {}
    for seq, (_, _, state) in enumerate(moves, start=1):
        values += [(k, seq, pack(v), None, 0) for k, v in state.items() if before.get(k) != v]
        before = state
    task = ["tsk_loopy", "acme", "loopy", 1, "SUCCEEDED", 9, pack({}), len(moves), None,
            len(moves), 12, None, 1_800_000_000.0, 1_800_000_010.0, None, pack({"n": 3}), 0,
            END, pack({}), pack({}), pack({}), pack({}), None, "k1", None]
    return Recording(task=task, checkpoints=[
        Checkpoint(seq, seq - 1, left, to, 1_800_000_000.0 + seq)
        for seq, (left, to, _) in enumerate(moves, start=1)],
        values=values, blobs={}, actions=[], reads=[], agent_log=[], started_at=1_800_000_000.5)


async def test_a_loop_replays_the_same_and_a_changed_until_is_a_route_divergence() -> None:
    same = await replay_recording(recording(), ratchet.Registry([loopy()]))
    assert same.ok and [(s.kind, s.outcome) for s in same.steps] == [
        ("step", "same"), ("loop", "same"), ("loop", "same"), ("loop", "same"), ("step", "same")]
    changed = await replay_recording(recording(), ratchet.Registry([loopy(), loopy(2, goal=2)]),
                                     version=2)
    assert [d.to_dict() for d in changed.divergences] == [
        {"kind": "route", "step": "count", "checkpoint": 3, "recorded": "count",
         "replayed": "done"}]


async def test_a_changed_state_is_a_structural_diff_and_a_missing_node_is_named() -> None:
    moves = [*MOVES[:3], ("count", "count", {"n": 2, "extra": [1]}), *MOVES[3:]]
    report = await replay_recording(recording(moves), ratchet.Registry([loopy()]))
    # At 4 the code went on where the recording did not: another state and another route;
    # from then on each node starts from the recorded state again, and does the same.
    assert [(d.kind, d.checkpoint, d.detail) for d in report.divergences] == [
        ("route", 4, {"recorded": "count", "replayed": "done"}),
        ("state", 4, {"diff": {"added": [], "removed": [["extra", [1]]],
                                "changed": [["n", 2, 3]]}})]
    assert [s.outcome for s in report.steps] == ["same"] * 3 + ["different"] + ["same"] * 2
    renamed = await replay_recording(recording(), ratchet.Registry([loopy(rename=True)]))
    assert [(d.kind, d.step) for d in renamed.divergences] == [("missing_node", "begin")]


async def test_an_export_file_round_trips_its_recordings(tmp_path: Path) -> None:
    out = tmp_path / "corpus.rtc"
    assert write_recordings(out, [recording(), recording()]) == 2
    back = list(read_recordings(out))
    assert [r.task_id for r in back] == ["tsk_loopy", "tsk_loopy"]
    assert back[0].checkpoints == recording().checkpoints
    assert (await replay_recording(back[0], ratchet.Registry([loopy()]))).ok
    write_recordings(tmp_path / "more.rtc", [recording()])
    assert len(list(corpus_recordings(str(tmp_path), tmp_path / "none.db"))) == 3  # a directory
    (tmp_path / "notes.txt").write_text("not an export")
    with pytest.raises(UsageError, match="not a file"):
        list(corpus_recordings(str(tmp_path), tmp_path / "none.db"))
