"""Every step is bounded unless its author asks otherwise: a default step timeout
(``DEFAULT_STEP_TIMEOUT``), a workflow's ``step_timeout``, a step's ``timeout``, and
``timeout=None`` only when given; a step running long is reported in the log before it
times out (docs/workflows.md, "Step timeouts")."""

from __future__ import annotations

import asyncio

import pytest
import structlog

import ratchet
from ratchet.actors.workflow.nodes import DEFAULT_STEP_TIMEOUT, StepNode
from ratchet.protocol.errors import WorkflowDefinitionError
from tests.conftest import NodeFactory, wait_terminal


def _timeouts(wf: ratchet.Workflow) -> dict[str, float | None]:
    return {name: node.timeout for name, node in wf.nodes.items() if isinstance(node, StepNode)}


async def _noop(ctx: ratchet.StepContext) -> dict[str, object]:
    return {}


def test_a_step_that_gives_no_timeout_gets_the_default() -> None:
    wf = ratchet.Workflow("plain")
    wf.add_step("work", _noop)
    assert _timeouts(wf) == {"work": DEFAULT_STEP_TIMEOUT}
    assert DEFAULT_STEP_TIMEOUT == 600.0  # the figure docs/workflows.md states


def test_a_workflow_sets_its_steps_timeout_and_a_step_its_own_or_none_when_asked() -> None:
    wf = ratchet.Workflow("mixed", step_timeout=30)
    wf.add_step("inherits", _noop)
    wf.add_step("own", _noop, timeout=5)
    wf.add_step("unbounded", _noop, timeout=None)
    assert _timeouts(wf) == {"inherits": 30, "own": 5, "unbounded": None}

    unbounded = ratchet.Workflow("unbounded", step_timeout=None)
    unbounded.add_step("work", _noop)
    assert _timeouts(unbounded) == {"work": None}


def test_a_step_timeout_that_is_not_positive_is_refused_when_the_workflow_is_built() -> None:
    with pytest.raises(WorkflowDefinitionError, match="step_timeout must be > 0"):
        ratchet.Workflow("bad", step_timeout=0)


async def test_a_step_that_never_returns_fails_its_task_after_warnings_in_the_log(
        start_node: NodeFactory, client: ratchet.Client) -> None:
    wf = ratchet.Workflow("hangs", step_timeout=0.3)

    @wf.step
    async def hang(ctx: ratchet.StepContext) -> dict[str, object]:
        await asyncio.Event().wait()  # never set: the step never returns
        return {}

    await start_node(ratchet.Registry([wf]))
    with structlog.testing.capture_logs() as logs:
        task_id = (await client.submit("hangs", {}, key="h-1")).task_id
        events = await wait_terminal(client, task_id, timeout=30)

    assert events[-1].type == "task.failed"
    failures = [e.payload for e in events if e.type == "step.failed"]
    assert [f["attempt"] for f in failures] == [1, 2, 3]
    assert {f["error"]["message"] for f in failures} == {"step timed out"}
    slow = [e for e in logs if e["event"] == "step running long"]
    assert [w["attempt"] for w in slow] == [1, 2, 3]
    assert all(w["task_id"] == task_id and w["step"] == "hang" and w["timeout_s"] == 0.3
               and w["log_level"] == "warning" and w["elapsed_s"] > 0 for w in slow)
