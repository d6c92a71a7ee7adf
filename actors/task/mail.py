"""Which behaviour of a task handles which mail: the task actor's dispatch table.

Mail reaches a task actor as a :class:`actors.task.deps.DeliverMail`; its envelope type
picks the handlers here. Each handler answers how the mail was taken ("processed",
"late", "duplicate", ...), which the mail router acknowledges and logs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ratchet.actors.task import control as task_control
from ratchet.actors.task import (
    crash_loop,
    decision_audit,
    exhausted,
    graph_runtime,
    revalidate,
    risk_gate,
    settle,
    sleep_node,
    step_sleep,
)
from ratchet.actors.task import waits as task_waits
from ratchet.actors.task.kernel import TaskKernel
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.messages import Envelope

__all__ = ["MailHandler", "MAIL"]

#: A behaviour's handler of one kind of mail: how it took it, or None when the mail is
#: not its own (the next handler for the type is asked).
MailHandler = Callable[[TaskKernel, Envelope], Awaitable[str | None]]


async def _start(actor: TaskKernel, env: Envelope) -> str:
    return await actor.start(env)


async def _graph_timer(actor: TaskKernel, env: Envelope) -> str | None:
    if env.body.get("kind") not in graph_runtime.TIMER_KINDS:
        return None  # an external wait's timer
    return await graph_runtime.on_timer(actor, env)


async def _decision(actor: TaskKernel, env: Envelope) -> str:
    # A crash-loop handoff's decision, a gated call's, a failed re-validation's, else a
    # graph approval node's. Applied ones are audited in their own commit; a refusal is
    # audited here (a repeat of an applied one is answered "duplicate" by the inbox and
    # raises past this).
    outcome = await crash_loop.on_recovery_decision(actor, env)
    for pseudo in (risk_gate.on_gate_decision, revalidate.on_revalidate_decision,
                   exhausted.on_exhausted_decision):
        if outcome is None:
            outcome = await pseudo(actor, env)
    if outcome is None:
        outcome = await graph_runtime.on_decision(actor, env)
    if outcome != "processed":
        await decision_audit.record_refused(actor, env, outcome)
    return outcome


async def _node_wait(actor: TaskKernel, env: Envelope) -> str | None:
    if not str(env.body.get("wait_kind", "")).startswith("node:"):
        return None  # an accepted action's confirmation
    return await graph_runtime.on_wait_resolved(actor, env)


#: Which behaviour handles which mail, by envelope type, in the order asked. Several may
#: share a type: a timer may be a sleep node's, the graph's or an external wait's (a
#: decision may be a crash-loop one or a graph approval's: ``_decision`` asks both, and
#: audits it).
MAIL: dict[str, tuple[MailHandler, ...]] = {
    MessageType.TASK_START: (_start,),
    MessageType.TASK_CONTROL: (task_control.handle_control,),
    MessageType.APPROVAL_DECISION: (_decision,),
    MessageType.BRANCH_DONE: (graph_runtime.on_branch_done,),
    MessageType.TIMER_FIRED: (sleep_node.on_sleep_timer, step_sleep.on_step_sleep_timer,
                              _graph_timer,
                              task_waits.handle_wait_mail),
    MessageType.EXTERNAL_RESOLVED: (_node_wait, task_waits.handle_wait_mail),
    MessageType.TASK_SETTLE: (settle.on_settle,),
}
