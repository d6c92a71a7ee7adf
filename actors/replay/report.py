"""What a replay reports: per recorded step, whether the code did the same again, and
every divergence with the step and the diff; for a corpus, a summary.

Divergence kinds:

================  =============================================================
``state``         the node left another state: ``diff`` is a structural diff
                  (protocol/state_history.py) from the recorded state to the
                  replayed one
``route``         the node moved elsewhere: ``recorded`` and ``replayed`` targets
``tool_request``  a tool call the recording does not hold as asked: ``fields``
                  (which arguments differ, recorded → replayed), ``key``
``unrecorded``    a call with no recorded counterpart at all (blocked: a write is
                  never made live, a read only with ``live_reads``)
``model_request`` an agent's model request differs from the recorded one:
                  ``messages`` is a structural diff of the conversations
``error``         the node raised where the recording went on
``missing_node``  the recording left a node the workflow no longer has
================  =============================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CorpusReport", "Divergence", "ReplayReport", "StepReport"]


@dataclass(slots=True)
class Divergence:
    kind: str
    step: str
    checkpoint: int
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "checkpoint": self.checkpoint,
                **self.detail}


@dataclass(slots=True)
class StepReport:
    """One recorded checkpoint replayed: ``outcome`` is ``same``, ``different`` or
    ``skipped`` (a node kind replay does not re-run: its recorded move is taken)."""

    checkpoint: int
    step: str
    kind: str
    outcome: str = "same"
    divergences: list[Divergence] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "step": self.step, "kind": self.kind,
                "outcome": self.outcome,
                "divergences": [d.to_dict() for d in self.divergences]}


@dataclass(slots=True)
class ReplayReport:
    task_id: str
    workflow: str
    recorded_version: int
    replayed_version: int
    steps: list[StepReport] = field(default_factory=list)
    #: Calls answered from the recording, and reads that went live (``live_reads``).
    answered: int = 0
    live_reads: int = 0

    @property
    def divergences(self) -> list[Divergence]:
        return [d for s in self.steps for d in s.divergences]

    @property
    def ok(self) -> bool:
        """No divergence: the exit status of ``ratchet replay`` is 0 only then."""
        return not any(s.divergences for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {"replay": True, "task_id": self.task_id, "workflow": self.workflow,
                "recorded_version": self.recorded_version,
                "replayed_version": self.replayed_version, "ok": self.ok,
                "steps_replayed": len(self.steps), "answered_from_recording": self.answered,
                "live_reads": self.live_reads,
                "divergences": [d.to_dict() for d in self.divergences],
                "steps": [s.to_dict() for s in self.steps]}


@dataclass(slots=True)
class CorpusReport:
    """Many recorded tasks replayed against one candidate: a row per workflow."""

    reports: list[ReplayReport] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)  # could not be replayed at all

    @property
    def ok(self) -> bool:
        return not self.failed and all(r.ok for r in self.reports)

    @property
    def divergent(self) -> list[ReplayReport]:
        return [r for r in self.reports if not r.ok]

    def table(self) -> list[dict[str, Any]]:
        """One row per workflow (and version replayed): tasks, steps, divergent tasks, and
        the divergences by kind."""
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for r in self.reports:
            row = rows.setdefault((r.workflow, r.replayed_version), {
                "workflow": r.workflow, "version": r.replayed_version, "tasks": 0, "steps": 0,
                "divergent_tasks": 0, "divergences": {}})
            row["tasks"] += 1
            row["steps"] += len(r.steps)
            row["divergent_tasks"] += 0 if r.ok else 1
            for d in r.divergences:
                row["divergences"][d.kind] = row["divergences"].get(d.kind, 0) + 1
        return list(rows.values())

    def to_dict(self) -> dict[str, Any]:
        return {"replay": True, "corpus": True, "ok": self.ok, "tasks": len(self.reports),
                "divergent_tasks": [r.task_id for r in self.divergent],
                "divergences": sum(len(r.divergences) for r in self.reports),
                "not_replayed": self.failed, "summary": self.table()}
