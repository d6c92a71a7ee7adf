"""The order a node's root children start in: what its tasks need first, then the rest.

A restarted node resumes its tasks before it finishes starting (docs/operations.md,
"Restart (W4)"): the root supervisor starts with the children a task needs to run and to
be heard — the outbox relay (its events leave), the tasks supervisor, the mail
supervisor (one mail router per partition held) and the lease manager; the node then takes
its leases and activates the unfinished tasks of those partitions (``LeaseManager.start``);
only then are the other children started (requests, admin, timers, schedules, the
sweepers, the external and decision routers, intake), in their declared order, and the
node waits for its request services to subscribe before it says it is serving.

Nothing a resumed task does waits on those: a timer it sets fires once the timer service
runs (it reads due timers from the store), a decision or external event waits in its
stream until its router consumes it, and a task's cancel or admin command is a request
that is answered once the node serves. Fencing and leases are unchanged: a task runs
only in a partition whose lease this node took, with that lease's token on every write.
"""

from __future__ import annotations

import structlog

from ratchet.actors.core.actor import ActorRef, ActorSystem
from ratchet.supervisors.services.request_service import Ready
from ratchet.supervisors.supervision.supervisor import (
    ChildSpec,
    StartChildren,
    Supervisor,
    WhichChildren,
)

__all__ = ["RESUME_FIRST", "split_children", "start_the_rest"]

log = structlog.get_logger("ratchet.node")

#: The root's children a resumed task needs (see the module's doc).
RESUME_FIRST = frozenset({"outbox", "tasks", "mail", "leases"})
#: The request services waited for before the node serves.
_REQUEST_SERVICES = ("api", "admin")


def split_children(specs: list[ChildSpec]) -> tuple[list[ChildSpec], list[ChildSpec]]:
    """``specs`` as (started with the root, started after the tasks resumed), each in the
    declared order."""
    return ([s for s in specs if s.id in RESUME_FIRST],
            [s for s in specs if s.id not in RESUME_FIRST])


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
