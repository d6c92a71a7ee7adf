"""Sandboxed replay and regression corpora (issue 15): a recorded task's workflow code run
again in process, its tool and model calls answered from the recording, and a report of
where the code now does something else (docs/workflows.md, "Replay and regression corpus").

``history`` reads the recording (the store opened read-only, or an export file), ``answers``
answers calls from it, ``kernel`` is the task as a replayed node sees it, ``engine`` walks the
checkpoints, ``report`` says what it found, ``corpus`` replays many tasks.
"""

from ratchet.actors.replay.answers import ReplayDivergence
from ratchet.actors.replay.corpus import replay_corpus
from ratchet.actors.replay.engine import replay_recording
from ratchet.actors.replay.history import (
    Recording,
    export_tasks,
    open_read_only,
    read_recordings,
    read_task,
    select_tasks,
    write_recordings,
)
from ratchet.actors.replay.report import CorpusReport, Divergence, ReplayReport, StepReport

__all__ = ["CorpusReport", "Divergence", "Recording", "ReplayDivergence", "ReplayReport",
           "StepReport", "export_tasks", "open_read_only", "read_recordings", "read_task", "replay_corpus",
           "replay_recording", "select_tasks", "write_recordings"]
