"""What a task actor holds back until its changes are durable.

A step's commit is *pipelined* (``TaskChange.pipelined``; persistence/pipelined.py): with
``synchronous=FULL`` the actor starts the next step while the WAL sync of the last one
runs. The step's events wait for that sync in the store; this module covers what the actor
itself answers: the outcome of a mail (the router acks or replies on it) may rest on a
change of its state that is not on disk yet — "not at that node yet, ignored" said of a
step an OS crash would undo — so :func:`settled` waits for the actor's last change first.
A change committed without pipelining is durable when its ``apply`` returns, and so is
every change before it (one WAL, synced in order).

Also here: recording a failed step attempt (its own commit, never pipelined).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ratchet.actors.task.kernel import TaskKernel
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import RatchetError

__all__ = ["Durability", "note", "record_step_failure", "settled"]


class Durability(Protocol):
    #: The durability of the actor's last pipelined change (None: nothing to wait for).
    undurable: asyncio.Future[None] | None


def note(actor: Durability, durable: asyncio.Future[None] | None) -> None:
    """After each commit: a pipelined one's future (a later plain commit's None means all
    before it are durable too)."""
    actor.undurable = durable


async def settled(actor: Durability) -> None:
    """Return once the actor's last change is durable (at once when it is); raises the
    sync's error if it never will be (the mail is then not acked, and comes again)."""
    durable, actor.undurable = actor.undurable, None
    if durable is not None:
        await durable


async def record_step_failure(actor: TaskKernel, name: str, index: int, attempt: int,
                              exc: BaseException) -> None:
    """Commit one failed attempt of a step (``step.failed``), not pipelined."""
    error: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": "step timed out" if isinstance(exc, TimeoutError) else str(exc)[:2000],
        **({"code": exc.code.value} if isinstance(exc, RatchetError) else {})}
    await actor.commit(step_failed=True, events=[(EventType.STEP_FAILED, {
        "step": name, "index": index, "attempt": attempt, "error": error})])
