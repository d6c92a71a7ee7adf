"""An operator's ``retry-branch``: one failed (or timed-out) branch of a fan-out whose join
has not decided runs again, from its last committed step, and the others are left alone.

A behaviour of the task (:class:`actors.task.kernel.TaskKernel`), run in the task actor's own
asyncio task for a ``task.control`` mail with ``action: retry-branch`` (the admin service's
verb, supervisors/services/admin_settle.py). The task reopens the branch's row (FAILED or
TIMED_OUT back to RUNNING, its attempts counted, its progress kept) with a
``branch.retried`` event in one commit, then has the join recount the rows — the join stays
the one owner of the completion set — and the visit's pool run the branch (a pool that had
ended is started again by the fan-out's start, which runs the branches still RUNNING).
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.task.branch_place import run_branches
from ratchet.actors.task.fanout import Recount
from ratchet.actors.task.fanout_run import fanout_key
from ratchet.actors.task.kernel import TaskKernel
from ratchet.persistence.graph_rows import BranchWrites
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import BranchSettled
from ratchet.protocol.states import TaskStatus

__all__ = ["retry_branch"]

#: The settled statuses an operator may run again (SUCCEEDED is final; CANCELLED is the
#: join's own doing once it decided).
RETRYABLE = ("FAILED", "TIMED_OUT")


async def retry_branch(actor: TaskKernel, request: dict[str, Any]) -> str:
    """Reopen ``request["branch"]`` of the fan-out ``request["fanout"]`` (its key,
    ``<node>#<visit>``, or the node's name for its current visit); answers ``retried``, or
    ``refused:<CODE>: why``."""
    fanout, branch = str(request.get("fanout") or ""), str(request.get("branch") or "")
    node = fanout.partition("#")[0]
    key = fanout if "#" in fanout else fanout_key(actor, node)
    if actor.status is not TaskStatus.RUNNING or actor.current != node \
            or fanout_key(actor, node) != key or key not in actor.joins:
        return f"refused:CONFLICT: fan-out {key} is not waiting for its join (the task is" \
               f" {actor.status.value} at {actor.current})"
    row = await actor.deps.store.branch(actor.task_id, key, branch)
    if row is None:
        return f"refused:NOT_FOUND: no branch {branch!r} in fan-out {key}"
    if row["status"] not in RETRYABLE:
        return f"refused:CONFLICT: branch {branch} is {row['status']}, not FAILED or TIMED_OUT"
    try:
        await actor.commit(branches=BranchWrites(key, reopen=[branch]), events=[(
            EventType.BRANCH_RETRIED, {"node": node, "key": key, "branch": branch,
                                       "attempt": None, "by": request.get("by"),
                                       "error": None})])
    except BranchSettled as exc:  # settled otherwise between the read and the commit
        return f"refused:CONFLICT: {exc.message}"
    children = actor.deps.children
    join = children.lookup_child(actor.task_id, f"join:{key}")
    if join is not None:
        join.tell(Recount())
    await run_branches(actor, key, [branch])  # where it is placed, from its progress
    return "retried"
