"""A regression corpus: many recorded tasks replayed against one candidate registry (a new
version of the code), summed up per workflow (actors/replay/report.py's ``CorpusReport``)."""

from __future__ import annotations

from collections.abc import Iterable

from ratchet.actors.replay.engine import replay_recording
from ratchet.actors.replay.history import Recording
from ratchet.actors.replay.report import CorpusReport
from ratchet.actors.workflow.registry import Registry
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.secrets import Sealer

__all__ = ["replay_corpus"]


async def replay_corpus(recordings: Iterable[Recording], registry: Registry, *,
                        version: int | None = None, live_reads: bool = False,
                        sealer: Sealer | None = None) -> CorpusReport:
    """Replay each recording; a task that cannot be replayed at all (its workflow or version
    is not in ``registry``, a blob is missing) is listed under ``failed``, not raised."""
    report = CorpusReport()
    sealer = sealer or Sealer()
    for rec in recordings:
        try:
            report.reports.append(await replay_recording(
                rec, registry, version=version, live_reads=live_reads, sealer=sealer))
        except RatchetError as exc:
            report.failed.append({"task_id": rec.task_id, **exc.to_wire()})
    return report
