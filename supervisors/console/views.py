"""The console's read side: what the task list, a task page and the nodes page show,
read from the store with the checks the admin read verbs make (supervisors/services/
admin_reads.py): the viewer role in the task's tenant, and another tenant's task is
NOT_FOUND (no existence leak).

Page views read the store directly instead of going through ``AdminActor.answer``: a page
shows a handful of reads and the admin service would audit each (two audit rows per read,
per page refresh). What changes something goes through the admin service: actions.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ratchet.actors.workflow.registry import Registry
from ratchet.persistence.ports import StorePort
from ratchet.protocol.admin_verbs import SYSTEM_TENANT, VERB_ROLES
from ratchet.protocol.auth import Principal
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import InvalidMessage, NotFound, RatchetError
from ratchet.supervisors.console.auth import authorize
from ratchet.supervisors.console.pages import AGES, control_box, decision_box, diff_html
from ratchet.supervisors.console.svg import graph_svg

__all__ = ["Reader", "TaskView"]

#: Events that open a decision (their payload names the one-time ``approval_id``).
_ASKING = (EventType.APPROVAL_REQUESTED.value, EventType.TASK_HANDOFF.value,
           EventType.TASK_RECOVERY_STOPPED.value)
#: The task list reads at most this many pages of a tenant's tasks for one page shown.
MAX_PAGES = 20
#: The most events a task page shows (the last ones).
MAX_EVENTS = 500
#: Ledger states a human may settle with ``resolve``.
UNSETTLED = ("UNKNOWN", "PENDING", "IN_FLIGHT", "FAILED")


@dataclass
class TaskView:
    rec: Any
    data: dict[str, Any]


class Reader:
    def __init__(self, store: StorePort, registry: Registry, clock: Clock, leases: Any) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.leases = leases  # supervisors.node.leases.LeaseManager, or None

    async def tenants_of(self, who: Principal) -> list[str]:
        """The tenants ``who`` may see: its own, or for ``_system`` every tenant known."""
        if who.tenant != SYSTEM_TENANT:
            return [who.tenant]
        known = {t for _, t, _ in await self.store.active_tasks()}
        known |= {p.tenant for p in await self.store.principals()}
        known.discard(SYSTEM_TENANT)
        return sorted(known)

    async def task_list(self, who: Principal, filters: dict[str, str | None],
                        limit: int = 100) -> tuple[list[dict[str, Any]], str | None]:
        """Newest first, filtered by tenant, status, workflow and age; a ``cursor`` (one
        tenant only) pages on."""
        tenant, cursor = filters.get("tenant"), filters.get("cursor")
        if cursor is not None:  # as the admin verb list checks it: "<created_at>/<task id>"
            created, slash, _ = cursor.partition("/")
            try:
                if not slash or not tenant:
                    raise ValueError
                float(created)
            except ValueError:
                raise InvalidMessage("cursor must be one from a previous page") from None
        tenants = [tenant] if tenant else await self.tenants_of(who)
        for t in tenants:
            authorize(who, t, "list")
        rows: list[dict[str, Any]] = []
        more: str | None = None
        for t in tenants:
            found, after = await self._scan(t, filters, limit,
                                            filters.get("cursor") if tenant else None)
            rows += found
            if tenant:
                more = after
        rows.sort(key=lambda r: r["created_at"], reverse=True)
        return rows[:limit], more

    async def _scan(self, tenant: str, filters: dict[str, str | None], limit: int,
                    cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """Up to ``limit`` of the tenant's tasks that pass the filters, from ``cursor`` on,
        reading at most ``MAX_PAGES`` pages; and the cursor after the last row read (None:
        nothing further can match)."""
        now, age = self.clock.now(), AGES.get(filters.get("age") or "")
        rows: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):  # a rare filter must not scan a whole tenant
            page, cursor = await self.store.list_tasks(
                tenant, status=filters.get("status"), workflow=filters.get("workflow"),
                limit=limit, cursor=cursor)
            for row in page:
                older = now - row["created_at"]
                if age is not None and age[2] and older >= age[1]:
                    return rows, None  # newest first: no younger one further on
                if age is None or (older < age[1]) == age[2]:
                    rows.append({**row, "tenant": tenant})
                    if len(rows) == limit:
                        return rows, f"{row['created_at']!r}/{row['task_id']}"
            if cursor is None:
                return rows, None
        return rows, cursor

    async def task(self, who: Principal, task_id: str) -> Any:
        """The task's row, if ``who`` may view it; NOT_FOUND otherwise (another tenant's)."""
        try:
            rec = await self.store.load_task(task_id)
        except NotFound:
            raise NotFound("no such task", task_id=task_id) from None
        if not who.acts_in(rec.tenant):
            raise NotFound("no such task", task_id=task_id)  # no existence leak
        authorize(who, rec.tenant, "get")
        return rec

    async def pending(self, rec: Any, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The task's open decisions: asked for by an event, still PENDING in the store."""
        out, seen = [], set()
        for event in reversed(events):
            payload = event.get("payload") or {}
            approval_id = payload.get("approval_id")
            if event["type"] not in _ASKING or not approval_id or approval_id in seen:
                continue
            seen.add(approval_id)
            row = await self.store.approval(approval_id)
            if row is None or row["task_id"] != rec.task_id or row["status"] != "PENDING":
                continue
            kind = (payload.get("request") or {}).get("kind") if isinstance(
                payload.get("request"), dict) else None
            out.append({"approval_id": approval_id, "node": payload.get("node"),
                        "request": payload.get("request", payload.get("reason")),
                        # the hash of the request shown: a decision is bound to it
                        "request_hash": payload.get("request_hash") or row["request_hash"],
                        "expires_at": row["expires_at"],
                        "at": event.get("occurred_at"), "kind": kind or event["type"]})
        return out

    async def task_page(self, who: Principal, task_id: str, csrf: str,
                        chosen: tuple[int, int] | None) -> TaskView:
        rec = await self.task(who, task_id)
        events = await self.store.events(rec.task_id)
        actions = await self.store.task_actions(rec.task_id)
        names = await self.store.checkpoint_names(rec.task_id)
        unknown = [(a.key, a.request_hash) for a in actions if a.status in UNSETTLED]
        may_resolve = who.has(VERB_ROLES["resolve"]) if "resolve" in VERB_ROLES else None
        data: dict[str, Any] = {
            "actions": actions, "checkpoints": names, "chosen": chosen,
            "handoffs": await self.store.handoffs(rec.task_id),
            "events": events[-MAX_EVENTS:],
            "more_events": len(events) if len(events) > MAX_EVENTS else 0,
            "decisions": decision_box(rec.task_id, await self.pending(rec, events),
                                      who.has(VERB_ROLES["approve"]), may_resolve,
                                      unknown if rec.status in ("UNKNOWN", "WAITING_APPROVAL")
                                      else [], csrf),
            "control": control_box(rec.task_id, rec.status, who.has(VERB_ROLES["cancel"]),
                                   csrf),
            "graph": self.graph(rec), "owner": await self.owner(rec.task_id)}
        if chosen is not None and names:
            a, b = (min(max(1, c), len(names)) for c in chosen)
            old, new = (await self.store.load_state(rec.task_id, a),
                        await self.store.load_state(rec.task_id, b))
            data["chosen"], data["diff"] = (a, b), diff_html(a, b, old.values, new.values)
        return TaskView(rec, data)

    def graph(self, rec: Any) -> str | None:
        try:
            wf = self.registry.get(rec.workflow, rec.workflow_version)
        except RatchetError:
            return None
        kinds = {name: node.kind for name, node in wf.nodes.items()}
        return graph_svg(wf.start, kinds, wf.transition_table(), rec.current_node, rec.visits)

    async def owner(self, task_id: str) -> str | None:
        if self.leases is None:
            return None
        lease = await self.leases.lease_of(task_id)
        return lease.owner if lease is not None and lease.ttl_left > 0 else None

    async def nodes(self, who: Principal) -> tuple[list[dict[str, Any]], list[Any]]:
        """Nodes and leases, as ``admin nodes`` shows them: a ``_system`` viewer's."""
        authorize(who, SYSTEM_TENANT, "nodes")
        leases = await self.store.leases()
        ttl = self.leases.settings.ttl if self.leases is not None else 5.0
        nodes = [{"node_id": row.node_id, "status": row.status,
                  "alive": row.status != "stopped" and row.age < ttl,
                  "heartbeat_at": row.heartbeat_at, "started_at": row.started_at,
                  "heartbeat_age_s": row.age, "info": row.info,
                  "partitions": [lease.partition for lease in leases
                                 if lease.owner == row.node_id and lease.ttl_left > 0]}
                 for row in await self.store.nodes()]
        return nodes, leases
