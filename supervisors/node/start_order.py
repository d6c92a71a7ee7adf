"""The order a node's root children start in: what its tasks need first, then the rest.

A restarted node resumes its tasks before it finishes starting (docs/operations.md,
"Restart (W4)"): the root supervisor starts with the children a task needs to run and to
be heard — the outbox relay (its events leave), the tasks supervisor, the mail
supervisor (one mail router per partition held) and the lease manager; the node then takes
its leases and activates the unfinished tasks of those partitions (``LeaseManager.start``);
only then are the other children started (requests, admin, timers, schedules, the
sweepers, the external and decision routers, intake: supervisors/node/later_children.py),
in that order, and the node waits for its request services to subscribe before it says
it is serving.

Their modules are not even imported before the tasks resume: :func:`load_later_children`
imports them on a thread once the tasks run, so that the ~15 ms they take fall into the
tasks' waits (a step's I/O, NATS's answers) instead of delaying them. (Imported on a thread
during the start's own waits instead, for the nats-server to start, they slowed what the
start does meanwhile by about as much: the loop waits for the GIL at each of its steps.)

Nothing a resumed task does waits on those: a timer it sets fires once the timer service
runs (it reads due timers from the store), a decision or external event waits in its
stream until its router consumes it, and a task's cancel or admin command is a request
that is answered once the node serves. Fencing and leases are unchanged: a task runs
only in a partition whose lease this node took, with that lease's token on every write.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from ratchet.actors.core.actor import ActorRef, ActorSystem
from ratchet.supervisors.services.request_service import Ready
from ratchet.supervisors.supervision.supervisor import (
    ChildSpec,
    StartChildren,
    Supervisor,
    WhichChildren,
)

if TYPE_CHECKING:
    from ratchet.supervisors.node.later_children import LaterDeps

__all__ = ["LaterChildren", "load_later_children", "start_the_rest"]

log = structlog.get_logger("ratchet.node")

#: The request services waited for before the node serves.
_REQUEST_SERVICES = ("api", "admin")
#: Seconds the import thread holds the GIL at most while the loop waits for it.
_SWITCH_WHILE_IMPORTING = 0.0005

#: later_children.py's dependencies class and the function that makes the children's specs.
LaterChildren = tuple["type[LaterDeps]", Callable[["LaterDeps"], list[ChildSpec]]]


def _import_later_children() -> LaterChildren:
    # The loop keeps its turn: a thread holding the GIL gives it up to a waiting one only
    # every switch interval (5 ms by default), which would hold up each step of the start
    # that needs the loop (a spawn, an answer from NATS) while this thread imports.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, _SWITCH_WHILE_IMPORTING))
    try:
        from ratchet.supervisors.node.later_children import LaterDeps, later_children
    finally:
        sys.setswitchinterval(interval)
    return LaterDeps, later_children


def load_later_children() -> asyncio.Task[LaterChildren]:
    """Start importing supervisors/node/later_children.py on a thread (see the module's
    doc); await the task for its ``(LaterDeps, later_children)``. Its failure is raised to
    the one that awaits it, and never reported as unretrieved if the start ended first."""
    loading = asyncio.ensure_future(asyncio.to_thread(_import_later_children))
    loading.add_done_callback(lambda t: t.cancelled() or t.exception())
    return loading


async def start_the_rest(system: ActorSystem, root: ActorRef[Supervisor],
                         rest: list[ChildSpec]) -> None:
    """Start ``rest`` under the root, then wait until the request services have subscribed,
    so a request right after start finds a responder."""
    await root.ask(StartChildren(rest), timeout=30.0)
    await root.ask(WhichChildren(), timeout=30.0)  # after their on_start
    for name in _REQUEST_SERVICES:
        service = system.lookup(f"node/{name}")
        try:
            if service is not None:
                await service.ask(Ready(), timeout=30.0)
        except Exception as exc:  # it crashed starting: its supervisor restarts it
            log.warning("request service not ready", service=name, error=repr(exc))
