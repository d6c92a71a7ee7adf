"""Sandboxed replay: a recorded task's workflow code run again, in process, against its
recorded history (docs/workflows.md, "Replay and regression corpus").

For each recorded checkpoint (a node move) the engine puts the task where the recording
stood before it — its state, its time, its step index — and runs the node of the candidate
workflow (the task's own version, or another): a step's function with a
:class:`~actors.workflow.nodes.StepContext` whose ``call`` is answered from the recording
(actors/replay/answers.py); a choice's guard; a routing table's key; an agent's turn by the
runtime's own agent code (actors/replay/kernel.py). It then compares what the node did
with what was recorded: the state it left (a structural diff, protocol/state_history.py)
and the node it moved to. Each node starts from the *recorded* state, so one change shows
where it happens instead of at every step after it.

Fan-outs, maps, approvals, waits and sleep nodes are not re-run (their recorded move is
taken, the step reported ``skipped``): their work is other steps' or other people's.

Nothing here can reach the outside world: no store is written (the history is read from a
file opened read-only, or an export), nothing is published (there is no bus), no tool
session or model is called (unless ``live_reads`` lets a read go live). Logs are bound
with ``replay=True``.
"""

from __future__ import annotations

import copy
from typing import Any

import msgpack
import structlog

from ratchet.actors.replay.answers import Answers, ReplayDivergence
from ratchet.actors.replay.history import Checkpoint, Recording
from ratchet.actors.replay.kernel import ReplayClock, ReplayEnded, ReplayKernel
from ratchet.actors.replay.report import Divergence, ReplayReport, StepReport
from ratchet.actors.task.agent_node import run_agent
from ratchet.actors.workflow.loop_node import LoopNode
from ratchet.actors.workflow.nodes import (
    FAIL,
    AgentNode,
    ChoiceNode,
    Node,
    RouteNode,
    StepContext,
    StepNode,
)
from ratchet.actors.workflow.registry import Registry, Workflow
from ratchet.protocol.redaction import redact, redacting
from ratchet.protocol.secrets import Sealer
from ratchet.protocol.state_history import structural_diff

__all__ = ["replay_recording"]

log = structlog.get_logger("ratchet.replay")


async def replay_recording(recording: Recording, registry: Registry, *,
                           version: int | None = None, until: int | None = None,
                           live_reads: bool = False, sealer: Sealer | None = None
                           ) -> ReplayReport:
    """Replay one recorded task against ``registry``'s workflow (``version``: another
    version than the task's own) up to checkpoint ``until`` (default: all of them).

    Raises:
        UnknownWorkflow: the registry has no such workflow or version.
    """
    sealer = sealer or Sealer()
    record = recording.record(sealer)
    workflow = registry.get(record.workflow, version or record.workflow_version)
    answers = Answers(recording.ledger(sealer), recording.reads, sealer,
                      dict(registry.resources), task_id=record.task_id, tenant=record.tenant,
                      live_reads=live_reads)
    start = recording.started_at or record.created_at
    kernel = ReplayKernel(record, workflow, registry, sealer, answers, ReplayClock(start))
    report = ReplayReport(record.task_id, record.workflow, record.workflow_version,
                          workflow.version)
    states = recording.states(sealer)
    before = next(states)
    at = start
    broken: set[str] = set()  # agent conversations a divergence cut short
    spending = _model_spending(answers)
    for cp in recording.checkpoints:
        if until is not None and cp.seq > until:
            break
        after = next(states)
        kernel.begin(cp.seq, cp.step_index, cp.step_name, copy.deepcopy(before), at)
        kernel.spent = _spent_before(spending, cp.step_index)
        step = await _replay_node(kernel, workflow, recording, sealer, cp, after, broken)
        report.steps.append(step)
        before, at = after, cp.created_at
    report.answered, report.live_reads = answers.answered, answers.went_live
    log.info("replayed", task_id=record.task_id, replay=True, steps=len(report.steps),
             divergences=len(report.divergences))
    return report


async def _replay_node(kernel: ReplayKernel, workflow: Workflow, recording: Recording,
                       sealer: Sealer, cp: Checkpoint, after: dict[str, Any],
                       broken: set[str]) -> StepReport:
    node = workflow.nodes.get(cp.step_name)
    if node is None:
        kind = "pseudo" if cp.step_name.startswith(("@", "fork of ")) else "missing"
        step = StepReport(cp.seq, cp.step_name, kind, "skipped" if kind == "pseudo" else
                          "different")
        if kind == "missing":
            step.divergences.append(Divergence("missing_node", cp.step_name, cp.seq, {
                "recorded_next": cp.next_node}))
        return step
    step = StepReport(cp.seq, cp.step_name, _kind(node))
    scope = f"{node.name}#{kernel.visits.get(node.name, 0)}"
    if step.kind == "skipped" or scope in broken:
        step.outcome = "skipped"
        _count_visit(kernel, node, cp)
        return step
    if isinstance(node, AgentNode):
        kernel.messages = lambda: [m.to_dict() for m in kernel.conversations[scope].messages]
        kernel.recorded_messages = lambda: [b for k, b in recording.agent_entries(sealer, scope)
                                            if k == "message"]
    to: str | None = None
    try:
        to = await _run(kernel, node)
    except ReplayDivergence:
        if isinstance(node, AgentNode):  # its later turns would answer another conversation
            broken.add(scope)
    except ReplayEnded as ended:
        kernel.divergences.append(Divergence("route", node.name, cp.seq, {
            "recorded": cp.next_node, "replayed": None,
            "ended": str(ended.change.get("status_event") or "suspended")}))
    except Exception as exc:  # the node raised where the recording went on
        kernel.divergences.append(Divergence("error", node.name, cp.seq, {
            "type": type(exc).__name__, "message": str(exc)[:500]}))
    else:
        _compare(kernel, node, cp, after, to)
    step.divergences = kernel.divergences
    step.outcome = "different" if step.divergences else "same"
    _count_visit(kernel, node, cp)
    return step


async def _run(kernel: ReplayKernel, node: Node) -> str | None:
    """Run ``node`` as the runtime would; where it moves."""
    if isinstance(node, StepNode):
        await _run_step(kernel, node)
        return _loop_target(kernel, node) if isinstance(node, LoopNode) else node.next
    if isinstance(node, ChoiceNode):
        target: str = node.guard(kernel.state)
        return target
    if isinstance(node, RouteNode):
        key = node.key(kernel.state)
        return node.table.get(key) or node.default
    assert isinstance(node, AgentNode)
    await run_agent(kernel, node)
    return kernel.moved


async def _run_step(kernel: ReplayKernel, step: StepNode) -> None:
    record = kernel.record
    assert record is not None and kernel.workflow is not None
    ctx = StepContext(
        task_id=record.task_id, tenant=record.tenant, workflow=kernel.workflow.name,
        step_name=step.name, step_index=kernel.next_step, attempt=1, input=record.input,
        state=kernel.state, clock=kernel.deps.clock,
        log=kernel.log.bind(step=step.name, checkpoint=kernel.checkpoint),
        runner=kernel.runner(kernel.next_step, step.timeout),
        iteration=kernel.visits.get(step.name, 0) if isinstance(step, LoopNode) else None)
    update = await step.fn(ctx)
    kernel.state.update(update or {})


def _model_spending(answers: Answers) -> list[tuple[int, float, float]]:
    """``(step index, tokens, money)`` of every recorded model call, in step order."""
    out = []
    for row in answers.by_key.values():
        if row.kind == "model" and isinstance(row.result, dict):
            tokens = float(row.result.get("prompt_tokens", 0) or 0) + float(
                row.result.get("completion_tokens", 0) or 0)
            out.append((row.step_index, tokens, float(row.result.get("cost", 0) or 0)))
    return sorted(out)


def _spent_before(spending: list[tuple[int, float, float]], step_index: int) -> dict[str, float]:
    """What the task's model calls had spent before the node at ``step_index`` (an agent's
    budget reservation, hence its request's ``max_tokens``, depends on it)."""
    done = [s for s in spending if s[0] < step_index]
    if not done:
        return {}
    return {"tokens": sum(s[1] for s in done), "money": sum(s[2] for s in done),
            "model_calls": float(len(done))}


def _loop_target(kernel: ReplayKernel, node: LoopNode) -> str:
    """Where an iteration leaves a loop, as ``loop_runtime.leave_iteration`` decides: the
    loop again, ``next`` once ``until`` holds (or the last iteration ran), or
    ``on_exhausted``."""
    last = kernel.visits.get(node.name, 0) + 1 >= node.max_iterations
    finished = bool(node.until(kernel.state)) if node.until is not None else last
    if finished:
        return node.next
    return node.on_exhausted if last and node.on_exhausted != FAIL else node.name


def _compare(kernel: ReplayKernel, node: Node, cp: Checkpoint, after: dict[str, Any],
             to: str | None) -> None:
    if to is not None and to != cp.next_node:
        kernel.divergences.append(Divergence("route", node.name, cp.seq, {
            "recorded": cp.next_node, "replayed": to}))
    recorded, replayed = redact(after), redact(_plain(kernel.state))
    if recorded != replayed:
        kernel.divergences.append(Divergence("state", node.name, cp.seq, {
            "diff": structural_diff(recorded, replayed)}))


def _plain(state: dict[str, Any]) -> Any:
    """The state as a checkpoint would keep it (a tuple is a list once recorded)."""
    return msgpack.unpackb(msgpack.packb(state, use_bin_type=True, default=redacting),
                           raw=False, strict_map_key=False)


def _kind(node: Node) -> str:
    if isinstance(node, LoopNode):
        return "loop"
    for kind, cls in (("step", StepNode), ("choice", ChoiceNode), ("route", RouteNode),
                      ("agent", AgentNode)):
        if isinstance(node, cls):
            return kind
    return "skipped"


def _count_visit(kernel: ReplayKernel, node: Node, cp: Checkpoint) -> None:
    """The visits the runtime counts (an agent's own turns and a loop's iterations aside),
    which name an agent's conversation (``node#visit``) and a loop's iteration."""
    if isinstance(node, LoopNode):
        if cp.next_node == node.name:
            kernel.visits[node.name] = kernel.visits.get(node.name, 0) + 1
        else:
            kernel.visits.pop(node.name, None)
    elif isinstance(node, AgentNode) and cp.next_node == node.name:
        return
    elif node.counts_visits:
        kernel.visits[node.name] = kernel.visits.get(node.name, 0) + 1
