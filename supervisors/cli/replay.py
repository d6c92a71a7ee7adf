"""``ratchet replay`` and ``ratchet export`` (docs/cli.md): a recorded task's code run again
in process against its history (actors/replay/), and recorded tasks written to a file that
``replay --corpus`` reads.

Both read the store the node uses, opened read-only (``--store``: a SQLite file or a
``postgresql://`` URL; else ``$RATCHET_STORE``; else ``<state-dir>/ratchet.db``:
supervisors/cli/replay_store.py): neither can write to it, and neither talks to NATS. The secret key is read
(never created) from ``$RATCHET_SECRET_KEY`` or ``<state-dir>/keys/secrets.key``; without
it, secrets stay sealed and a step that opens one diverges.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ratchet.actors.replay import (
    CorpusReport,
    Recording,
    read_recordings,
    read_task,
    replay_corpus,
    replay_recording,
    select_tasks,
)
from ratchet.protocol.errors import UsageError
from ratchet.protocol.secrets import Sealer
from ratchet.supervisors.cli.common import ExitCode, emit, load_app
from ratchet.supervisors.cli.replay_flags import export_flags, parse_since, replay_flags
from ratchet.supervisors.cli.replay_store import export_from, history_store, open_history
from ratchet.supervisors.node.secret_key import KEY_ENV, KEY_FILE, parse_key

__all__ = ["export_command", "export_flags", "parse_since", "replay_command", "replay_flags",
           "replay_sealer", "corpus_recordings", "store_path"]

_QUERY_KEYS = ("workflow", "status", "since", "tenant", "limit")


def store_path(args: argparse.Namespace) -> str | Path:
    """The store the command reads: a SQLite file or a PostgreSQL URL (replay_store.py)."""
    return history_store(args.store, args.state_dir)


def replay_sealer(state_dir: str | Path) -> Sealer:
    """The store's secret key if it is at hand (read, never created), else no key."""
    text = os.environ.get(KEY_ENV)
    path = Path(state_dir) / KEY_FILE
    if not text and path.is_file():
        text = path.read_text()
    try:
        return Sealer(parse_key(text)) if text else Sealer()
    except ValueError as exc:
        raise UsageError(f"the secret key cannot be read: {exc}") from None


def corpus_recordings(corpus: str, store: str | Path) -> Iterator[Recording]:
    """The recordings ``--corpus`` names: an export file, a directory of them (``*.rtc``
    and any other file, in name order), or a query of the store (``key=value,...``)."""
    path = Path(corpus)
    if path.exists():
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        try:
            for f in files:
                yield from read_recordings(f)
        except ValueError as exc:  # a file that is not an export: the caller's to fix
            raise UsageError(f"--corpus: {exc}") from None
        return
    filters = _query(corpus)
    with open_history(store) as conn:
        for task_id in select_tasks(conn, **filters):
            yield read_task(conn, task_id)


def _query(text: str) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in _QUERY_KEYS:
            raise UsageError(f"--corpus {text!r}: neither a file, a directory nor a query of"
                             f" {', '.join(_QUERY_KEYS)} (e.g. workflow=x,status=SUCCEEDED)")
        filters[key] = (parse_since(value) if key == "since" else int(value)
                        if key == "limit" else value)
    return filters


async def replay_command(args: argparse.Namespace) -> int:
    """Exit 0 only if nothing diverged (docs/cli.md)."""
    if not args.app:
        raise UsageError("name the candidate code: --app module:object (or $RATCHET_APP)")
    if (args.task_id is None) == (args.corpus is None):
        raise UsageError("name one task to replay, or a --corpus (not both)")
    registry = load_app(args.app)
    sealer = replay_sealer(args.state_dir)
    if args.corpus is not None:
        report: CorpusReport = await replay_corpus(
            corpus_recordings(args.corpus, store_path(args)), registry,
            version=args.version, live_reads=args.live_reads, sealer=sealer)
        emit(report.to_dict())
        return ExitCode.OK if report.ok else ExitCode.FAILED
    with open_history(store_path(args)) as conn:
        recording = read_task(conn, args.task_id)
    one = await replay_recording(recording, registry, version=args.version, until=args.until,
                                 live_reads=args.live_reads, sealer=sealer)
    emit(one.to_dict())
    return ExitCode.OK if one.ok else ExitCode.FAILED


async def export_command(args: argparse.Namespace) -> int:
    count = export_from(store_path(args), args.out, task_ids=args.task or None,
                         workflow=args.workflow, status=args.status, since=args.since,
                         tenant=args.tenant, limit=args.limit)
    emit({"exported": count, "out": str(args.out), "secrets": "sealed"})
    return ExitCode.OK
