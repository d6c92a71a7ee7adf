"""Replay from tests: gate a release on recorded tasks (docs/workflows.md, "Replay and
regression corpus").

``await replay(task_id, app, state_dir=...)`` replays one recorded task of a store against
``app`` (a Registry, a Workflow or a list of them: the candidate code) and returns its
:class:`~ratchet.actors.replay.ReplayReport`; ``await replay_corpus(corpus, app)`` replays
an export file (``ratchet export``), a directory of them, or a query of a store, and returns
a :class:`~ratchet.actors.replay.CorpusReport` whose ``ok`` a test asserts. The store is
the SQLite file in ``state_dir``, or ``store``: another SQLite file or a ``postgresql://``
URL. Nothing is written to it (opened read-only), nothing is published, no provider is
called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ratchet.actors.replay import (
    CorpusReport,
    ReplayReport,
    read_task,
    replay_recording,
)
from ratchet.actors.replay import (
    replay_corpus as _replay_corpus,
)
from ratchet.actors.workflow.registry import Registry
from ratchet.supervisors.cli.replay import corpus_recordings, replay_sealer
from ratchet.supervisors.cli.replay_store import export_from, open_history

__all__ = ["CorpusReport", "ReplayReport", "export", "replay", "replay_corpus"]


async def replay(task_id: str, app: Any, *, state_dir: str | Path, version: int | None = None,
                 until: int | None = None, live_reads: bool = False,
                 store: str | Path | None = None) -> ReplayReport:
    """Replay ``task_id`` of the store in ``state_dir`` (or ``store``: a SQLite file or a
    PostgreSQL URL) against ``app``; ``report.ok`` is True when nothing diverged."""
    with open_history(_store(state_dir, store)) as conn:
        recording = read_task(conn, task_id)
    return await replay_recording(recording, Registry.coerce(app), version=version,
                                  until=until, live_reads=live_reads,
                                  sealer=replay_sealer(state_dir))


async def replay_corpus(corpus: str | Path, app: Any, *, state_dir: str | Path = ".ratchet",
                        version: int | None = None, live_reads: bool = False,
                        store: str | Path | None = None) -> CorpusReport:
    """Replay every task of ``corpus`` (an export file, a directory of them, or a query such
    as ``"workflow=expense,status=SUCCEEDED,since=1d"`` of the store in ``state_dir``, or of
    ``store``)."""
    recordings = corpus_recordings(str(corpus), _store(state_dir, store))
    return await _replay_corpus(recordings, Registry.coerce(app), version=version,
                                live_reads=live_reads, sealer=replay_sealer(state_dir))


def export(state_dir: str | Path, out: str | Path, *, store: str | Path | None = None,
           **filters: Any) -> int:
    """Write the store's recorded tasks matching ``filters`` (``workflow``, ``status``,
    ``since`` as an epoch time, ``tenant``, ``limit``; or ``task_ids``) to ``out``, as
    ``ratchet export`` does; returns how many. ``store``: as for :func:`replay`."""
    return export_from(_store(state_dir, store), out, **filters)


def _store(state_dir: str | Path, store: str | Path | None) -> str | Path:
    if store is None:
        return Path(state_dir) / "ratchet.db"
    return store if isinstance(store, Path) or store.startswith("postgres") else Path(store)
