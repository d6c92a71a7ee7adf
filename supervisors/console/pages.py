"""The console's pages as HTML, from data the views read: the task list, a task (summary,
graph, pending decision, ledger, checkpoints and their diff, events), the nodes.

Pure functions of their arguments: no I/O here, so each page is tested and timed apart
from the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ratchet.protocol.redaction import redact
from ratchet.supervisors.console.render import age, esc, pretty, q, status, table, ts, url

__all__ = ["AGES", "decision_box", "diff_html", "nodes_body", "task_body", "tasks_body"]

#: The task list's age filter: value → (label, seconds, younger-than?).
AGES: dict[str, tuple[str, float, bool]] = {
    "lt1h": ("younger than 1 h", 3600, True), "lt1d": ("younger than 1 day", 86400, True),
    "gt1h": ("older than 1 h", 3600, False), "gt1d": ("older than 1 day", 86400, False),
    "gt7d": ("older than 7 days", 7 * 86400, False),
}
STATUSES = ("QUEUED", "RUNNING", "SLEEPING", "WAITING_EXTERNAL", "WAITING_APPROVAL", "PAUSED",
            "UNKNOWN", "SUCCEEDED", "FAILED", "CANCELLED")


def _select(name: str, options: Sequence[tuple[str, str]], chosen: str | None) -> str:
    opts = "".join(f'<option value="{esc(v)}"{" selected" if v == (chosen or "") else ""}>'
                   f"{esc(label)}</option>" for v, label in options)
    return f'<select name="{name}" id="f-{name}">{opts}</select>'


def tasks_body(rows: list[dict[str, Any]], filters: Mapping[str, str | None],
               tenants: Sequence[str], workflows: Sequence[str], now: float,
               more: str | None) -> str:
    """The task list with its filter form; ``rows`` carry ``tenant``."""
    form = ('<form method="get" action="/tasks" class="box">'
            + "tenant " + _select("tenant", [("", "any"), *((t, t) for t in tenants)],
                                  filters.get("tenant"))
            + " status " + _select("status", [("", "any"), *((s, s) for s in STATUSES)],
                                   filters.get("status"))
            + " workflow " + _select("workflow", [("", "any"), *((w, w) for w in workflows)],
                                     filters.get("workflow"))
            + " age " + _select("age", [("", "any"), *((k, v[0]) for k, v in AGES.items())],
                                filters.get("age"))
            + ' <button id="filter">Filter</button></form>')
    cells = [(f'<a href="/tasks/{q(r["task_id"])}">{esc(r["task_id"])}</a>', esc(r["tenant"]),
              f'{esc(r["workflow"])} v{esc(r["workflow_version"])}', status(r["status"]),
              ts(r["created_at"]), age(now - r["created_at"]), ts(r["updated_at"]))
             for r in rows]
    after = (f'<p><a id="more" href="{url("/tasks", **filters, cursor=more)}">older tasks'
             "</a></p>") if more else ""
    return ("<h1>Tasks</h1>" + form + table(
        ["task", "tenant", "workflow", "status", "created", "age", "updated"], cells,
        "no task matches") + after)


def _summary(rec: Any, now: float, owner: str | None) -> str:
    rows = [("status", status(rec.status)), ("tenant", esc(rec.tenant)),
            ("workflow", f"{esc(rec.workflow)} v{esc(rec.workflow_version)}"),
            ("current node", esc(rec.current_node or "—")), ("version", esc(rec.version)),
            ("created", f"{ts(rec.created_at)} ({age(now - rec.created_at)} ago)"),
            ("updated", f"{ts(rec.updated_at)} ({age(now - rec.updated_at)} ago)"),
            ("deadline", ts(rec.deadline_at)), ("lease owner", esc(owner or "—")),
            ("budget", pretty(rec.budget)), ("spent", pretty(rec.spent))]
    if rec.sandbox:  # a what-if run (docs/admin.md, "fork --sandbox"): never production's
        rows.insert(1, ("sandbox", f"a sandbox fork of {esc(rec.sandbox.get('source'))}:"
                        " no write reached a provider"))
    if rec.error:
        rows.append(("error", pretty(rec.error)))
    if rec.output is not None:
        rows.append(("output", pretty(rec.output)))
    body = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table id="summary">{body}</table>'


def decision_box(task_id: str, pending: list[dict[str, Any]], may_decide: bool,
                 may_resolve: bool | None, unknown: list[tuple[str, str]], csrf: str) -> str:
    """Pending approvals and handoffs, with approve / reject buttons for approvers and a
    resolve form per unsettled action ``(key, request hash)`` when the node serves the
    ``resolve`` verb (``may_resolve`` None: it does not)."""
    if not pending and not unknown:
        return ""
    parts = ["<h2>Waiting for a human</h2>"]
    hidden = f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
    for p in pending:
        expires = f", expires {ts(p['expires_at'])}" if p.get("expires_at") else ""
        forms = ""
        if may_decide:
            fields = (hidden + f'<input type="hidden" name="approval_id" value="{esc(p["approval_id"])}">'
                      f'<input type="hidden" name="request_hash" value="{esc(p.get("request_hash") or "")}">')
            action = f"/tasks/{q(task_id)}"
            forms = (f'<form method="post" action="{action}/approve" class="inline">{fields}'
                     '<input name="reason" placeholder="reason (optional)">'
                     '<button id="approve" class="approve">Approve</button></form>'
                     f'<form method="post" action="{action}/reject" class="inline"'
                     f' data-confirm="Reject this request?">{fields}'
                     '<button id="reject" class="reject">Reject</button></form>')
        else:
            forms = '<p class="ro">read-only: deciding needs the approver role</p>'
        parts.append(f'<div class="box pending" data-approval="{esc(p["approval_id"])}">'
                     f'<b>{esc(p.get("kind") or "approval")}</b> at node {esc(p.get("node"))}'
                     f' — approval {esc(p["approval_id"])} (asked {ts(p.get("at"))}{expires})'
                     f"{pretty(p.get('request'))}{forms}</div>")
    if may_resolve is not None and unknown:
        if may_resolve:
            parts.extend(_resolve_form(task_id, key, digest, hidden) for key, digest in unknown)
        else:
            parts.append('<p class="ro">unsettled actions: resolving needs the approver role</p>')
    return "".join(parts)


def _ledger(actions: list[Any]) -> str:
    return table(["key", "tool", "kind", "status", "attempts", "provider id", "request hash",
                  "updated", "result / error"],
                 ((esc(a.key), esc(a.tool), esc(a.kind), status(a.status), esc(a.attempts),
                   esc(a.provider_id or "—"), esc(a.request_hash[:19]), ts(a.updated_at),
                   pretty(a.error if a.error else a.result, 2000)) for a in actions),
                 "no ledger action")


def _checkpoints(task_id: str, names: list[str], chosen: tuple[int, int] | None) -> str:
    if not names:
        return '<p class="ro">no checkpoint yet</p>'
    a, b = chosen or (max(1, len(names) - 1), len(names))
    opts = [(str(i), f"#{i} {name}") for i, name in enumerate(names, 1)]

    def pick(name: str, value: int) -> str:
        return _select(name, opts, str(value))

    rows = ((esc(i), esc(name)) for i, name in enumerate(names, 1))
    return (table(["#", "after node"], rows)
            + f'<form method="get" action="/tasks/{q(task_id)}#diff" class="box">State diff'
            f' from {pick("from", a)} to {pick("to", b)} <button id="diff-go">Compare</button>'
            "</form>")


def diff_html(a: int, b: int, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """The state keys added, removed and changed from checkpoint ``a`` to ``b``."""
    rows = []
    for key in sorted(set(old) | set(new)):
        before, after = redact(old.get(key)), redact(new.get(key))
        if key not in old:
            rows.append(("add", key, "—", pretty(after, 4000)))
        elif key not in new:
            rows.append(("del", key, pretty(before, 4000), "—"))
        elif json.dumps(before, sort_keys=True, default=str) != json.dumps(
                after, sort_keys=True, default=str):
            rows.append(("chg", key, pretty(before, 4000), pretty(after, 4000)))
    body = "".join(f'<tr class="{c}"><td>{esc(k)}</td><td>{x}</td><td>{y}</td></tr>'
                   for c, k, x, y in rows)
    if not body:
        body = '<tr><td colspan="3" class="ro">no difference</td></tr>'
    return (f'<div id="diff"><h2>State diff #{a} → #{b}</h2><table><thead><tr><th>key</th>'
            f"<th>#{a}</th><th>#{b}</th></tr></thead><tbody>{body}</tbody></table></div>")


def _events(events: list[dict[str, Any]]) -> str:
    return table(["#", "at", "type", "payload"],
                 ((esc(e["sequence"]), ts(e.get("occurred_at")), esc(e["type"]),
                   pretty(e.get("payload"), 4000)) for e in events), "no event")


def task_body(rec: Any, data: Mapping[str, Any], now: float) -> str:
    """The task page: ``data`` holds ``graph`` (SVG or None), ``decisions`` (HTML),
    ``actions``, ``checkpoints`` (names), ``chosen``, ``diff`` (HTML), ``events``,
    ``handoffs``, ``owner``, ``flash``, ``error``, ``more_events``."""
    flash = (f'<p class="flash" id="flash">{esc(data["flash"])}</p>' if data.get("flash")
             else "") + (f'<p class="error" id="action-error">{esc(data["error"])}</p>'
                         if data.get("error") else "")
    graph: str = data.get("graph") or '<p class="ro">the workflow is not served by this node</p>'
    handoffs = "".join(f'<div class="box">{esc(h.get("reason"))} — {ts(h.get("created_at"))}'
                       f' {"resolved " + ts(h["resolved_at"]) if h.get("resolved_at") else ""}'
                       f'{pretty(h.get("package"), 8000)}</div>' for h in data["handoffs"])
    more = (f'<p class="ro">showing the last {len(data["events"])} events of'
            f' {data["more_events"]}</p>' if data.get("more_events") else "")
    return (f'<h1>Task <span id="task-id">{esc(rec.task_id)}</span> {status(rec.status)}</h1>'
            + flash + _summary(rec, now, data.get("owner")) + str(data.get("control", ""))
            + str(data["decisions"])
            + "<h2>Graph</h2>" + graph
            + ("<h2>Handoffs</h2>" + handoffs if handoffs else "")
            + "<h2>Ledger actions</h2>" + _ledger(data["actions"])
            + "<h2>Checkpoints</h2>" + _checkpoints(rec.task_id, data["checkpoints"],
                                                    data.get("chosen"))
            + str(data.get("diff", "")) + "<h2>Events</h2>" + more + _events(data["events"]))


def nodes_body(nodes: list[dict[str, Any]], leases: list[Any], this_node: str) -> str:
    """The cluster: nodes with their heartbeats and partitions, and every lease."""
    node_rows = ((esc(n["node_id"]) + (" (this node)" if n["node_id"] == this_node else ""),
                  esc(n["status"]), "yes" if n["alive"] else "no", ts(n["heartbeat_at"]),
                  f'{n["heartbeat_age_s"]:.1f}s', ts(n["started_at"]),
                  esc(", ".join(map(str, n["partitions"])) or "—"), pretty(n["info"], 3000))
                 for n in nodes)
    lease_rows = ((esc(r.partition), esc(r.owner or "—"), esc(r.token),
                   f"{r.ttl_left:.1f}s" if r.ttl_left > 0 else "expired",
                   esc(r.previous_owner or "—"), "yes" if r.reaped else "no") for r in leases)
    return ("<h1>Nodes</h1>" + table(["node", "status", "alive", "heartbeat", "heartbeat age",
                                      "started", "partitions", "info"], node_rows)
            + "<h2>Partition leases</h2>" + table(
                ["partition", "owner", "fencing token", "ttl left", "previous owner", "reaped"],
                lease_rows))


def _resolve_form(task_id: str, key: str, digest: str, hidden: str) -> str:
    """Settle one action (admin verb ``resolve``), bound to the request hash shown."""
    return (f'<div class="box pending"><b>Settle action {esc(key)}</b> (admin verb resolve)'
            f'<form method="post" action="/tasks/{q(task_id)}/resolve">{hidden}'
            f'<input type="hidden" name="action" value="{esc(key)}">'
            f'<input type="hidden" name="request_hash" value="{esc(digest)}"> outcome '
            '<select name="outcome"><option>succeeded</option><option>failed</option>'
            '<option>compensated</option></select> evidence <input name="evidence"'
            ' size="40" required> result (JSON, for succeeded) <input name="result" size="30">'
            ' <button class="resolve">Resolve</button></form>'
            f'<form method="post" action="/tasks/{q(task_id)}/retry-action" class="inline"'
            ' data-confirm="Send it again under the same key?">'
            f'{hidden}<input type="hidden" name="action" value="{esc(key)}">'
            f'<input type="hidden" name="request_hash" value="{esc(digest)}">'
            '<input name="evidence" placeholder="no record at the provider because ..." size="40">'
            ' <button class="retry">Send again (retry-action)</button></form></div>')


#: The control buttons a task in each status offers (docs/admin.md, "Cancel, pause, resume").
_CONTROLS = {"QUEUED": ("pause", "cancel"), "RUNNING": ("pause", "cancel"),
             "SLEEPING": ("pause", "cancel"), "PAUSED": ("resume", "cancel"),
             "WAITING_EXTERNAL": ("cancel",), "WAITING_APPROVAL": ("cancel",),
             "UNKNOWN": ("cancel",)}


def control_box(task_id: str, task_status: str, may_operate: bool, csrf: str) -> str:
    """Pause, resume and cancel for operators (the admin verbs of those names)."""
    verbs = _CONTROLS.get(task_status, ())
    if not verbs or not may_operate:
        return ""
    hidden = f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
    confirm = ' data-confirm="Cancel this task?"'
    forms = "".join(
        f'<form method="post" action="/tasks/{q(task_id)}/{verb}" class="inline"'
        f'{confirm if verb == "cancel" else ""}>{hidden}'
        f'<button id="{verb}" class="{verb}">{verb.capitalize()}</button></form>'
        for verb in verbs)
    return (f'<div class="box" id="control">{forms}'
            '<p class="ro">cancel waits for a write in flight (docs/admin.md)</p></div>')
