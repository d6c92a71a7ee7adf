"""A fan-out's ``max_concurrency``, cluster-wide: the task keeps at most that many of a
visit's branches started and not yet settled, wherever they run.

Each node's pool also bounds what it runs (``fanout.branch_slot``), but a visit's branches
are placed on every node's partitions (``branch_place.py``), so a per-node bound alone let
a fan-out run ``max_concurrency`` times the nodes bodies at once. The task, which owns the
completion set (its join), therefore starts its branches through a window:

- a visit's branches are started in their order (a fan-out's as declared, a map's by
  item), the first ``limit`` at once;
- each settlement counted by the join moves the window on: with ``settled`` branches
  settled, the first ``limit + settled`` may be started (``fanout.window_end``), so the
  next ones are sent ``branch.start`` as the join tells the task (``WindowMoved``, in
  steps of an eighth of the window: a move costs the task a turn and a mail per
  partition);
- the window needs no row of its own: which branches were started follows from the rows'
  statuses (pure: ``fanout.started``), so a restarted task, and a node taking a partition
  over (``BranchHost.resume``), start exactly the started ones still RUNNING, never one
  whose turn has not come.

An operator's ``retry-branch`` runs its branch at once, outside the window (it was started
once already). A visit with no more branches than ``limit`` has no window to move.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from ratchet.actors.task.branch_host import FanoutContext
from ratchet.actors.task.branch_place import place_branches
from ratchet.actors.task.fanout import WindowMoved, started, window_end
from ratchet.actors.task.kernel import TaskKernel
from ratchet.protocol.states import TaskStatus

__all__ = ["close_window", "on_window_moved", "open_window"]


@dataclass(slots=True)
class _Window:
    names: list[str]
    limit: int
    upto: int  # names[:upto] have been started
    context: FanoutContext


#: Per task actor, per fan-out key: the window of a visit it started.
_windows: weakref.WeakKeyDictionary[TaskKernel, dict[str, _Window]] = \
    weakref.WeakKeyDictionary()


def open_window(actor: TaskKernel, key: str, names: list[str],
                statuses: Mapping[str, str], limit: int, context: FanoutContext) -> list[str]:
    """The visit's window as its task starts it (or starts it again): the branches to
    start now. Kept for :func:`on_window_moved` when there are more than ``limit``."""
    settled = sum(1 for b in names if statuses.get(b, "RUNNING") != "RUNNING")
    end = window_end(len(names), limit, settled)
    if end < len(names):
        _windows.setdefault(actor, {})[key] = _Window(list(names), limit, end, context)
    else:
        _windows.get(actor, {}).pop(key, None)
    return started(names, statuses, limit)


async def on_window_moved(actor: TaskKernel, moved: WindowMoved) -> None:
    """Start the branches whose turn came (runs in the task actor's task). Nothing when
    the task is not running (paused, ended: its next start opens the window again) or the
    visit is over."""
    window = _windows.get(actor, {}).get(moved.key)
    if window is None or actor.status != TaskStatus.RUNNING or moved.key not in actor.joins:
        return
    end = window_end(len(window.names), window.limit, moved.settled)
    if end <= window.upto:
        return
    due, window.upto = window.names[window.upto:end], end
    if window.upto >= len(window.names):
        _windows[actor].pop(moved.key, None)
    # Not ``fresh`` even in a fresh visit: a node that took a partition over may have run
    # (and settled) one of them already, from the rows' view of the window; the host then
    # reads which are still RUNNING before it runs them.
    await place_branches(actor, moved.key, due, window.context, fresh=False)



def close_window(actor: TaskKernel, key: str) -> None:
    """The visit is over (its verdict applied, or its task stopped)."""
    _windows.get(actor, {}).pop(key, None)

