"""Why a task is where it is: the report ``admin diagnose`` answers, built from what the
store holds of the task (persistence/diagnose_rows.py) and the time.

Pure: the admin service supplies the task's record, its diagnosis rows and ``now``; this
module shapes them and writes the one-line verdict — the first of a short list of rules that
applies (a finished task; an outcome unknown; an approval; a provider's confirmation; an
external wait; a sleep; a pause; a queued task; a running one), followed by what is
scheduled and what went wrong on the way (retries, a deadline).
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.task.heartbeat import task_percent
from ratchet.protocol.catalogue import EventType as E

__all__ = ["STATUS_EVENTS", "age", "diagnose"]

#: The events that put a task in each status: the latest one says since when it is in it.
STATUS_EVENTS: dict[str, frozenset[str]] = {
    "QUEUED": frozenset({E.TASK_QUEUED, E.TASK_RESUMED, E.TASK_RECOVERED}),
    "RUNNING": frozenset({E.TASK_STARTED, E.APPROVAL_DECIDED, E.WAIT_COMPLETED,
                          E.SLEEP_COMPLETED, E.ACTION_RECONCILED, E.TASK_RECOVERED}),
    "WAITING_APPROVAL": frozenset({E.APPROVAL_REQUESTED, E.TASK_HANDOFF}),
    "WAITING_EXTERNAL": frozenset({E.TASK_WAITING_EXTERNAL, E.WAIT_STARTED}),
    "SLEEPING": frozenset({E.SLEEP_STARTED}),
    "PAUSED": frozenset({E.TASK_PAUSED}),
    "UNKNOWN": frozenset({E.TASK_UNKNOWN, E.ACTION_UNKNOWN}),
    "SUCCEEDED": frozenset({E.TASK_SUCCEEDED}),
    "FAILED": frozenset({E.TASK_FAILED}),
    "CANCELLED": frozenset({E.TASK_CANCELLED}),
}
_RETRIES = frozenset({E.ACTION_RETRY, E.STEP_FAILED, E.BRANCH_FAILED, E.ACTION_FAILED,
                      E.ACTION_UNKNOWN})
_RECOVERY = frozenset({E.TASK_RECOVERED, E.TASK_RECOVERY_STOPPED, E.STEP_INTERRUPTED})
#: Seconds without a heartbeat after which the lease owner is called silent.
SILENT_AFTER = 30.0


def age(seconds: float | None) -> str:
    """A duration as people read it: ``45 s``, ``12 min``, ``3 h``, ``2 d``."""
    if seconds is None:
        return "?"
    s = abs(seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} d"


def _error_text(payload: Any) -> str | None:
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or error)[:300]
    return None if error is None else str(error)[:300]


def _budget(rec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, limit in (rec.budget or {}).items():
        if isinstance(limit, int | float) and not isinstance(limit, bool):
            spent = float((rec.spent or {}).get(name, 0.0))
            out[name] = {"limit": limit, "spent": spent, "left": limit - spent}
    return out


def _action(a: Any, now: float) -> dict[str, Any]:
    return {"key": a.key, "tool": a.tool, "kind": a.kind, "status": a.status,
            "attempts": a.attempts, "accepted": a.accepted, "provider_id": a.provider_id,
            "request_hash": a.request_hash, "since": a.updated_at,
            "for_s": now - a.updated_at, "next_attempt_at": a.next_attempt_at,
            "next_attempt_in_s": None if a.next_attempt_at is None else a.next_attempt_at - now,
            "error": _error_text({"error": a.error})}


def _last_fanout(branches: list[dict[str, Any]], node: str | None) -> list[dict[str, Any]]:
    """The branches of the fan-out the task is in: the latest visit of ``node`` (rows keyed
    ``<node>#<visit>``), else (a fan-out at the start: no node committed yet) the visit
    whose branches still run."""
    groups: dict[tuple[bool, int, str], list[dict[str, Any]]] = {}
    for b in branches:
        name, _, visit = str(b["node"]).partition("#")
        key = (name == node, int(visit) if visit.isdigit() else 0, str(b["node"]))
        groups.setdefault(key, []).append(b)
    mine = [k for k in groups if k[0]] or [k for k in groups
                                           if any(b["status"] == "RUNNING" for b in groups[k])]
    return groups[max(mine)] if mine else []


def _progress(rec: Any, rows: dict[str, Any], now: float) -> dict[str, Any]:
    beats = {b["scope"]: b for b in rows["heartbeats"] if b["step"] == rec.current_node
             or b["scope"]}
    step = beats.get("")
    running = _last_fanout(rows["branches"], rec.current_node)
    shares = [1.0 if b["status"] != "RUNNING" else
              float((beats.get(b["branch"]) or {}).get("fraction") or 0.0) for b in running]
    done = rec.status == "SUCCEEDED"
    return {
        "percent": 100 if done else task_percent(rec.next_step, rec.steps_total,
                                                 (step or {}).get("fraction"), shares),
        "steps_completed": rec.next_step, "steps_total": rec.steps_total,
        "heartbeat": None if step is None else {**step, "age_s": now - step["at"]},
        "branches": {"total": len(running), "finished": sum(s == 1.0 for s in shares),
                     "beating": [{**b, "age_s": now - b["at"]} for k, b in beats.items()
                                 if k][:50]},
    }


def diagnose(rec: Any, rows: dict[str, Any], now: float) -> dict[str, Any]:
    """The diagnosis of the task ``rec`` (a ``TaskRecord``) from its ``rows``
    (``DiagnoseStore.diagnosis_rows``) at ``now`` (wall time, the node's clock)."""
    events = rows["events"]
    entered = [e["at"] for e in events if e["type"] in STATUS_EVENTS.get(rec.status, ())]
    since = entered[-1] if entered else rec.updated_at
    lease = rows["lease"]
    if lease is not None and lease.get("owner_heartbeat_at") is not None:
        lease = {**lease, "owner_heartbeat_age_s": now - lease["owner_heartbeat_at"]}
    report: dict[str, Any] = {
        "task_id": rec.task_id, "tenant": rec.tenant, "workflow": rec.workflow,
        "workflow_version": rec.workflow_version, "status": rec.status, "since": since,
        "for_s": now - since, "current_node": rec.current_node,
        "step": {"index": rec.next_step, "attempt": rec.step_failures + 1,
                 "failures": rec.step_failures},
        "lease": lease, "progress": _progress(rec, rows, now),
        "timers": [{**t, "in_s": t["due_at"] - now} for t in rows["timers"]],
        "waits": [{**w, "for_s": now - w["since"]} for w in rows["waits"]],
        "approvals": [{**a, "for_s": now - a["since"],
                       "expires_in_s": None if a["expires_at"] is None
                       else a["expires_at"] - now} for a in rows["approvals"]],
        "unsettled_actions": [_action(a, now) for a in rows["actions"]],
        "retries": [{"at": e["at"], "type": e["type"], "error": _error_text(e["payload"]),
                     "attempt": (e["payload"] or {}).get("attempt"),
                     "tool": (e["payload"] or {}).get("tool")}
                    for e in events if e["type"] in _RETRIES][-20:],
        "recovery": [{"at": e["at"], "type": e["type"], "payload": e["payload"]}
                     for e in events if e["type"] in _RECOVERY][-20:],
        "budget": _budget(rec), "deadline_at": rec.deadline_at,
        "deadline_in_s": None if rec.deadline_at is None else rec.deadline_at - now,
        "error": rec.error,
    }
    return {"verdict": verdict(rec, report), **report}


def _why(rec: Any, r: dict[str, Any]) -> str:
    """The first clause of the verdict: where the task is and what it waits for."""
    for_s = age(r["for_s"])
    actions, approvals, waits = r["unsettled_actions"], r["approvals"], r["waits"]
    if rec.status in ("SUCCEEDED", "FAILED", "CANCELLED"):
        error = (rec.error or {}).get("message") if isinstance(rec.error, dict) else None
        return f"finished {rec.status} {for_s} ago" + (f": {error}" if error else "")
    unknown = [a for a in actions if a["status"] == "UNKNOWN"]
    if rec.status == "UNKNOWN" or unknown:
        a = (unknown or actions or [None])[0]
        what = f"{a['tool']} {a['key']}" if a else "an external write"
        return (f"outcome of {what} unknown for {age(a['for_s'] if a else r['for_s'])}:"
                " reconciliation or a human must settle it (admin handoff)")
    if approvals:
        a = approvals[0]
        expiry = (f"; expires in {age(a['expires_in_s'])}"
                  if a["expires_in_s"] is not None else "")
        return (f"waiting for approval {a['approval_id']} at {a['node']} for"
                f" {age(a['for_s'])}{expiry}")
    confirming = [a for a in actions if a["accepted"]]
    if confirming:
        a = confirming[0]
        provider = f" (provider id {a['provider_id']})" if a["provider_id"] else ""
        return (f"waiting for provider confirmation of {a['key']}{provider} for"
                f" {age(a['for_s'])}")
    if waits:
        w = waits[0]
        return f"waiting for external {w['kind']} {w['correlation_id']} for {age(w['for_s'])}"
    if rec.status == "SLEEPING":
        return f"sleeping at {rec.current_node} for {for_s}"
    if rec.status == "PAUSED":
        by = (rec.control or {}).get("pause", {}).get("by")
        return f"paused{' by ' + str(by) if by else ''} for {for_s}; admin resume to go on"
    scheduled = [a for a in actions if a["next_attempt_at"] is not None]
    if rec.status == "QUEUED" and scheduled:
        a = scheduled[0]
        return (f"queued: retry {a['attempts'] + 1} of {a['tool']} {a['key']} due in"
                f" {age(a['next_attempt_in_s'])}")
    return _running(rec, r, for_s)


def _running(rec: Any, r: dict[str, Any], for_s: str) -> str:
    lease = r["lease"]
    owner = lease.get("owner") if lease else None
    if lease is not None and owner is None:
        return f"{rec.status} for {for_s}; no node holds partition {lease['partition']}"
    silent = lease.get("owner_heartbeat_age_s") if lease else None
    if silent is not None and silent > SILENT_AFTER:
        return (f"{rec.status} for {for_s} on {owner}, silent for {age(silent)}: its lease"
                " moves to another node when it expires")
    if rec.status == "QUEUED":
        return f"queued for {for_s}, waiting for a slot{' on ' + owner if owner else ''}"
    beat, step = r["progress"]["heartbeat"], r["step"]
    where = (f"running {rec.current_node} (attempt {step['attempt']})"
             f"{' on ' + owner if owner else ''} for {for_s}")
    if beat is not None:
        note = f" — {beat['note']}" if beat.get("note") else ""
        return (f"{where}, {r['progress']['percent']} %{note}; last heartbeat"
                f" {age(beat['age_s'])} ago")
    return where


def verdict(rec: Any, report: dict[str, Any]) -> str:
    """One line: why the task is where it is, what fires next, what went wrong on the way."""
    parts = [_why(rec, report)]
    if report["timers"] and rec.status not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        t = report["timers"][0]
        parts.append(f"{t['kind']} timer fires in {age(t['in_s'])}" if t["in_s"] > 0
                     else f"{t['kind']} timer overdue by {age(t['in_s'])}")
    if rec.step_failures and rec.status not in ("SUCCEEDED", "CANCELLED"):
        last = next((e for e in reversed(report["retries"]) if e["type"] == E.STEP_FAILED),
                    None)
        error = f", last: {last['error']}" if last and last["error"] else ""
        parts.append(f"step failed {rec.step_failures} time(s){error}")
    if report["deadline_in_s"] is not None and rec.status not in ("SUCCEEDED", "FAILED",
                                                                  "CANCELLED"):
        d = report["deadline_in_s"]
        parts.append(f"deadline in {age(d)}" if d > 0 else f"deadline passed {age(d)} ago")
    return "; ".join(p for p in parts if p)
