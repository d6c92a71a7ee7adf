"""The task's side of placed branches: where each branch of a fan-out visit runs, and the
mail that starts, holds and stops them there (``branch_host.py`` runs them).

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`), run in the task actor's
own asyncio task. A branch runs on the owner of its partition
(``partition_of(branch_id)``); the branches of one visit bound for one partition travel in
one mail. The partitions this node holds are served by its own host, called directly with
the task's view of the visit (no NATS, no read); the others get mail.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import structlog

from ratchet.actors.task.branch_host import BranchHost, FanoutContext, branch_mail
from ratchet.actors.task.kernel import TaskKernel
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.subjects import branch_id, partition_of

__all__ = ["branch_partitions", "hold_branches", "place_branches", "run_branches",
           "stop_branches"]

log = structlog.get_logger("ratchet.fanout")

#: Per task actor, per fan-out key: the partitions its visit's branches are placed on.
_placed: weakref.WeakKeyDictionary[TaskKernel, dict[str, set[int]]] = \
    weakref.WeakKeyDictionary()


def _host(actor: TaskKernel) -> BranchHost:
    host = actor.deps.branches
    if not isinstance(host, BranchHost):
        raise RatchetError("fan-out branches need a node's task supervision",
                           task_id=actor.task_id)
    return host


def branch_partitions(actor: TaskKernel, key: str, names: list[str]) -> dict[int, list[str]]:
    """``names`` by the partition each is placed on, in order."""
    parts: dict[int, list[str]] = {}
    n = actor.deps.partitions
    for name in names:
        parts.setdefault(partition_of(branch_id(actor.task_id, key, name), n), []).append(name)
    return parts


async def place_branches(actor: TaskKernel, key: str, names: list[str], context: FanoutContext,
                         *, fresh: bool) -> None:
    """Start ``names`` (RUNNING) where they are placed: one ``branch.start`` per
    partition; the partitions this node holds get ``context`` in process."""
    host = _host(actor)
    parts = branch_partitions(actor, key, names)
    _placed.setdefault(actor, {}).setdefault(key, set()).update(parts)
    node = context.shared.node
    here = [b for p, group in parts.items() if host.holds(p) for b in group]
    if here:  # every partition this node holds at once: one call, no mail
        await host.handle(branch_mail(MessageType.BRANCH_START, actor.task_id, key, here,
                                      node=node, fresh=fresh), context)
    # The other partitions' mails at once, not one ack after another: a moving window
    # (branch_window.py) sends a few after each settlement, from the task actor's turn.
    await asyncio.gather(*(
        host.send(actor.task_id, partition, branch_mail(
            MessageType.BRANCH_START, actor.task_id, key, group, node=node, fresh=fresh,
            armed=[b for b in group if b in context.armed]), context)
        for partition, group in parts.items() if not host.holds(partition)))


def _partitions(actor: TaskKernel, key: str, names: list[str] | None) -> set[int]:
    known = _placed.get(actor, {}).get(key)
    if known is not None:
        return known
    if names is None:  # this actor placed none of them: none runs for it
        return set()
    return set(branch_partitions(actor, key, names))


async def stop_branches(actor: TaskKernel, key: str, names: list[str] | None = None,
                        only: list[str] | None = None) -> None:
    """Cancel the visit's branches wherever they run (``only``: just these; ``names``: all
    of the visit's, to find their partitions when this actor placed none)."""
    host = _host(actor)
    if only is not None:
        for partition, group in branch_partitions(actor, key, only).items():
            await _quietly(host.send(actor.task_id, partition, branch_mail(
                MessageType.BRANCH_STOP, actor.task_id, key, group)))
        return
    for partition in sorted(_partitions(actor, key, names)):
        await _quietly(host.send(actor.task_id, partition, branch_mail(
            MessageType.BRANCH_STOP, actor.task_id, key, None)))
    _placed.get(actor, {}).pop(key, None)


async def run_branches(actor: TaskKernel, key: str, names: list[str]) -> None:
    """Run these branches again where they are placed, from their committed progress (an
    operator's ``retry-branch`` reopened them)."""
    host = _host(actor)
    for partition, group in branch_partitions(actor, key, names).items():
        _placed.setdefault(actor, {}).setdefault(key, set()).add(partition)
        await host.send(actor.task_id, partition, branch_mail(
            MessageType.BRANCH_START, actor.task_id, key, group, fresh=False))


async def hold_branches(actor: TaskKernel, reason: str) -> None:
    """Stop the branches of the task's fan-outs in progress at their next safe point (each
    commits its progress there and stays RUNNING); those held here are waited for up to
    the cancel timeout, the others are told by mail. The task then pauses, and its resume
    starts them again from there."""
    host, timeout = _host(actor), actor.deps.cancel_timeout
    for key in list(actor.joins):
        for partition in sorted(_partitions(actor, key, None)):
            late = await _quietly(host.send(actor.task_id, partition, branch_mail(
                MessageType.BRANCH_HOLD, actor.task_id, key, None, reason=reason,
                timeout=timeout)))
            if late:
                actor.log.warning("branches cut at the pause", key=key, branches=late)


async def _quietly(sending: Any) -> Any:
    """A hold or a stop that cannot be sent (NATS down, stopping) is logged, not raised:
    the verdict is committed (a branch that goes on is refused its writes: its row is no
    longer RUNNING), and a held branch's progress waits on its row for the resume."""
    try:
        return await sending
    except Exception as exc:
        log.warning("branch mail not sent", error=repr(exc))
        return None
