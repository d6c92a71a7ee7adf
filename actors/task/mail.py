"""Which behaviour of a task handles which mail: the task actor's dispatch table.

Mail reaches a task actor as a :class:`actors.task.deps.DeliverMail`; its envelope type
picks the handlers here. Each handler answers how the mail was taken ("processed",
"late", "duplicate", ...), which the mail router acknowledges and logs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ratchet.actors.task import control as task_control
from ratchet.actors.task import crash_loop, graph_runtime
from ratchet.actors.task import waits as task_waits
from ratchet.actors.task.kernel import TaskKernel
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.messages import Envelope

__all__ = ["MailHandler", "mail_table"]


MailHandler = Callable[[Envelope], Awaitable[str | None]]


def mail_table(actor: TaskKernel, start: MailHandler) -> dict[str, tuple[MailHandler, ...]]:
    """Which behaviour handles which mail. Several may share a type (a decision may be a
    crash-loop one or a graph approval's; a timer may be the graph's or an external wait's):
    each answers None for mail that is not its own, and the next one is asked."""

    def graph_timer(env: Envelope) -> Awaitable[str | None]:
        return _maybe(env.body.get("kind") in graph_runtime.TIMER_KINDS,
                      graph_runtime.on_timer, actor, env)

    def node_wait(env: Envelope) -> Awaitable[str | None]:
        return _maybe(str(env.body.get("wait_kind", "")).startswith("node:"),
                      graph_runtime.on_wait_resolved, actor, env)

    def bind(fn: Callable[[TaskKernel, Envelope], Awaitable[str | None]]) -> MailHandler:
        return lambda env: fn(actor, env)

    return {
        MessageType.TASK_START: (start,),
        MessageType.TASK_CONTROL: (bind(task_control.handle_control),),
        MessageType.APPROVAL_DECISION: (bind(crash_loop.on_recovery_decision),
                              bind(graph_runtime.on_decision)),
        MessageType.BRANCH_DONE: (bind(graph_runtime.on_branch_done),),
        MessageType.TIMER_FIRED: (graph_timer, bind(task_waits.handle_wait_mail)),
        MessageType.EXTERNAL_RESOLVED: (node_wait, bind(task_waits.handle_wait_mail)),
    }


async def _maybe(mine: bool, fn: Callable[[TaskKernel, Envelope], Awaitable[str]],
                 actor: TaskKernel, env: Envelope) -> str | None:
    return await fn(actor, env) if mine else None
