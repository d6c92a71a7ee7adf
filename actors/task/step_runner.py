"""The action runner a task actor gives one step: its ledger, budget, deadlines, sessions,
switches and secrets (actors/effects/actions.py), a sandbox fork's own runner
(actors/effects/sandbox.py); and the step's heartbeat (actors/task/heartbeat.py)."""

from __future__ import annotations

from typing import Any

from ratchet.actors.core.actor import ActorRef
from ratchet.actors.effects.actions import ActionRunner, CallEnv
from ratchet.actors.effects.sandbox import runner_for
from ratchet.actors.task.heartbeat import StepHeartbeat
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.read_record import RecordingRunner

__all__ = ["step_heartbeat", "step_runner"]


def step_runner(actor: TaskKernel, step_index: int, step_timeout: float | None, *,
                task_deadline: bool = True, count_tool_calls: bool = True) -> ActionRunner:
    """The action runner for one step. Compensations pass ``task_deadline=False``: an undo
    must still run when the task failed because its deadline passed."""
    record, deps = actor.record, actor.deps
    assert record is not None
    deadlines = [d for d in (record.deadline_at if task_deadline else None,
                             deps.clock.now() + step_timeout if step_timeout else None)
                 if d is not None]
    tenant = record.tenant

    async def commit(**change: Any) -> None:
        await actor.commit(**change)
        actor.open_actions.note(change.get("action"))  # in flight, unsettled, settled

    async def session(name: str) -> ActorRef[Any]:
        ref: ActorRef[Any] = await deps.children.session(actor.task_id, tenant, name)
        return ref

    env = CallEnv(
        task_id=actor.task_id, tenant=tenant, step_index=step_index, store=deps.store,
        clock=deps.clock, commit=commit, session=session,
        deadline=min(deadlines) if deadlines else None, rng=deps.rng,
        # Counting costs a read-modify-write per call: only for tasks with such a budget.
        count_tool_calls=count_tool_calls and "tool_calls" in record.budget,
        switches=deps.switches, note_secrets=actor.secrets.note,
        pause_requested=lambda: actor.pause_requested, spent=lambda: dict(actor.spent),
        remote_ask=deps.remote_ask)
    runner = runner_for(env, record.sandbox)
    if type(runner) is ActionRunner:  # not a sandbox fork's: its reads noted for replay
        return RecordingRunner(env, actor.open_actions.reads)  # (read_record.py)
    return runner


def step_heartbeat(actor: TaskKernel) -> StepHeartbeat:
    """The heartbeat of one step run of the task (not of a fan-out branch)."""
    return StepHeartbeat(actor.deps.store, actor.deps.clock, actor.task_id, "",
                         actor.deps.producer)
