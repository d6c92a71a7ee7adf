"""A step's own random numbers and ids (``ctx.random``, ``ctx.uuid()``) are seeded by where
the step runs: the same on a re-run and in a replay, so a replay of a step that draws
them reports no divergence — where ``uuid.uuid4()`` in the same step does."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import ratchet
from ratchet.protocol.clock import FakeClock
from ratchet.testing import replay
from tests.conftest import NodeFactory, wait_terminal


def _ctx(task_id: str = "tsk_1", step_index: int = 2, branch: str | None = None,
         iteration: int | None = None) -> ratchet.StepContext:
    return ratchet.StepContext(task_id=task_id, tenant="acme", workflow="w", step_name="s",
                               step_index=step_index, attempt=1, input={}, state={},
                               clock=FakeClock(), log=None, branch=branch, iteration=iteration)


def test_the_same_place_draws_the_same_numbers_and_another_place_others() -> None:
    first, again = _ctx(), _ctx()
    assert [first.random.random() for _ in range(3)] == [again.random.random() for _ in range(3)]
    assert first.uuid() == again.uuid() and first.uuid().version == 4
    others = [_ctx(step_index=3), _ctx(task_id="tsk_2"), _ctx(branch="b"), _ctx(iteration=0)]
    drawn = {ctx.random.random() for ctx in others} | {_ctx().random.random()}
    assert len(drawn) == 5


def _app(fresh_ids: bool) -> ratchet.Registry:
    wf = ratchet.Workflow("draws", version=1)

    @wf.step
    async def pick(ctx: ratchet.StepContext) -> dict[str, Any]:
        ref = str(uuid.uuid4()) if fresh_ids else str(ctx.uuid())
        return {"ref": ref, "sample": ctx.random.randrange(1_000_000)}

    @wf.step
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"ref": ctx.state["ref"]}}

    return ratchet.Registry([wf])


async def test_a_step_that_draws_from_its_context_replays_the_same(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path
) -> None:
    await start_node(_app(fresh_ids=False))
    task_id = (await client.submit("draws", {}, key="d-1")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"

    same = await replay(task_id, _app(fresh_ids=False), state_dir=tmp_path / "node")
    assert same.ok, same.to_dict()["divergences"]
    fresh = await replay(task_id, _app(fresh_ids=True), state_dir=tmp_path / "node")
    assert not fresh.ok  # uuid4 differs on each run: the state diverges at pick
    assert [s.step for s in fresh.steps if s.outcome == "different"] == ["pick"]
