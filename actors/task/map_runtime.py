"""How a task actor runs a map node: a fan-out over ``items(state)``, one branch per item.

Behaviours of the task (:class:`actors.task.kernel.TaskKernel`), run in the task actor's
own asyncio task. The items are checked before anything is recorded — a list or tuple, no
longer than ``max_items`` (``TooManyItems``), each item plain data msgpack can encode
(``InvalidStateValue``) — so a bad list fails the task once, with no branch row written.
Then the map is a fan-out visit like any other (``fanout_run.py``): branch ``"<i>"`` runs
item ``i`` with the state ``{"item": item, "index": i}``, a branch that finished before a
crash never runs again, and the join's verdict puts the results, in item order, in
``state[into]``. An empty list moves on at once with ``[]`` (one commit, no branch).

``items(state)`` is evaluated again when a crashed map resumes, on the same checkpointed
state: it must depend on the state alone, as a guard does. A resumed map whose list no
longer has the recorded width fails (``map items changed``) rather than run a mix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratchet.actors.task.fanout import JoinDone
from ratchet.actors.task.fanout_run import Joined, Visit, apply_verdict, fanout_key, start_visit
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.task.suspension import fail_with_saga
from ratchet.actors.workflow.join_policy import decide
from ratchet.actors.workflow.map_node import MapNode
from ratchet.protocol.errors import InvalidStateValue, RatchetError, TooManyItems

__all__ = ["on_map_joined", "start_map"]


async def start_map(actor: TaskKernel, node: MapNode) -> None:
    """Start the map's branches (or move on at once when it has no items)."""
    items = await _checked_items(actor, node)
    if items is None:
        return  # the task failed
    key = fanout_key(actor, node.name)
    names = [str(i) for i in range(len(items))]
    rows = await actor.deps.store.branches(actor.task_id, key)
    if rows and len(rows) != len(names):
        await fail_with_saga(actor, RatchetError(
            f"items of {node.name} changed since the map started: {len(rows)} items were"
            f" recorded, items(state) now returns {len(names)}", node=node.name),
            "map items changed")
        return
    if not names:
        verdict = decide(node.policy, {}, timed_out=False)
        assert verdict is not None  # nothing to wait for
        await apply_verdict(actor, JoinDone(key, node.name, verdict, {}), _joined(node, [], {}))
        return
    await start_visit(actor, Visit(
        key=key, node=node.name, names=names, graph_of=lambda _: node.branch,
        inputs={name: {"item": item, "index": i}
                for i, (name, item) in enumerate(zip(names, items, strict=True))},
        policy=node.policy, branch_timeout=node.item_timeout,
        max_concurrency=node.max_concurrency, retries=node.item_retries,
        started={"node": node.name, "key": key, "items": len(names), "branches": names},
    ), rows)


async def on_map_joined(actor: TaskKernel, node: MapNode, done: JoinDone) -> None:
    """Apply the join's verdict: ``state[into]`` = the results in item order."""
    v = done.verdict
    width = len(v.succeeded) + len(v.failed) + len(v.timed_out) + len(v.unfinished)
    await apply_verdict(actor, done, _joined(node, [str(i) for i in range(width)],
                                             done.results))


def _joined(node: MapNode, names: list[str], results: dict[str, Any]) -> Joined:
    # An item that did not succeed (at_least met without it) is None: the list stays
    # aligned with the items.
    return Joined(node=node.name, join=node.name, branches=names, into=node.into,
                  value=[results.get(b) for b in names], next=node.next)


async def _checked_items(actor: TaskKernel, node: MapNode) -> Sequence[Any] | None:
    """``items(state)`` if it is a list the map can run; else the task fails, and None."""
    try:
        items = node.items(actor.state)
        if not isinstance(items, list | tuple):
            raise TypeError(f"items must return a list or tuple, got {type(items).__name__}")
    except Exception as exc:
        await fail_with_saga(actor, exc, f"items of {node.name} raised")
        return None
    if len(items) > node.max_items:
        await fail_with_saga(actor, TooManyItems(
            f"items of {node.name} returned {len(items)} items, over its max_items of"
            f" {node.max_items}", node=node.name, items=len(items), limit=node.max_items),
            "map has too many items")
        return None
    for i, item in enumerate(items):
        try:
            actor.deps.store.secrets.pack(item)  # as the branch's state and result will be
        except (TypeError, ValueError, OverflowError) as exc:
            await fail_with_saga(actor, InvalidStateValue(
                f"item {i} of {node.name} is not plain data msgpack can encode: a"
                f" {type(item).__name__} ({exc})", node=node.name, index=i), "invalid map item")
            return None
    return items
