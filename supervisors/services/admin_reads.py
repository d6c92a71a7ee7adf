"""The admin service's read verbs — ``get``, ``history``, ``list``, ``handoff`` and ``tree``
— and the lookups every verb about a task starts with: a mixin of
:class:`~supervisors.services.admin.AdminActor`. Reads change nothing; like every verb they are
role-checked, deduplicated by command id and audited by ``AdminActor.answer``.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.core.actor import ActorSystem
from ratchet.actors.task.heartbeat import task_percent
from ratchet.persistence.ports import StorePort
from ratchet.protocol.clock import Clock
from ratchet.protocol.codec import canonical
from ratchet.protocol.errors import InvalidMessage, NotFound, RatchetError
from ratchet.protocol.ids import request_hash
from ratchet.protocol.messages import AdminCommand
from ratchet.protocol.subjects import partition_of
from ratchet.supervisors.supervision.supervisor import WhichChildren
from ratchet.supervisors.supervision.tasks import TASKS_ROOT, task_actor_name

__all__ = ["ReadVerbs", "model_stats"]


def model_stats(calls: list[Any]) -> list[dict[str, Any]]:
    """Ledger rows of model calls grouped by (node, model, version, configuration)."""
    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for row in calls:
        args, answer = row.args or {}, row.result or {}
        params = args.get("params", {}) if isinstance(args, dict) else {}
        # the budget's max_tokens cap varies per call; the configuration is the rest
        config = request_hash(canonical({k: v for k, v in params.items()
                                         if k != "max_tokens"}))[7:19]
        model = str(args.get("model", "")) if isinstance(args, dict) else ""
        key = (row.tool.removeprefix("model."), model, str(answer.get("version", "")), config)
        g = groups.setdefault(key, {"node": key[0], "model": key[1], "version": key[2],
                                    "config": key[3], "params": params, "calls": 0,
                                    "tokens": 0, "cost": 0.0, "cached": 0})
        g["calls"] += 1
        g["tokens"] += int(answer.get("prompt_tokens", 0)) + int(answer.get("completion_tokens", 0))
        g["cost"] += float(answer.get("cost", 0.0))
        g["cached"] += model.startswith("cache:")
    return sorted(groups.values(), key=lambda g: (g["node"], -g["calls"]))


class ReadVerbs:
    """The read verbs; ``_task`` and ``_int_arg`` serve every verb of the admin service."""

    store: StorePort
    system: ActorSystem
    clock: Clock
    node_id: str
    leases: Any  # supervisors.node.leases.LeaseManager (None: one node owns all)

    async def _task(self, tenant: str, cmd: AdminCommand) -> Any:
        """The task the command names; NOT_FOUND when it is another tenant's."""
        if not cmd.task_id:
            raise InvalidMessage("this verb needs task_id")
        record = await self.store.load_task(cmd.task_id)
        if record.tenant != tenant:
            raise NotFound("no such task", task_id=cmd.task_id)  # no existence leak
        return record

    async def _get(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        rec = await self._task(tenant, cmd)
        snapshot = (await self.store.snapshot(tenant, rec.task_id)).model_dump()
        owner: dict[str, Any] = {"owner": self.node_id}
        if self.leases is not None:
            lease = await self.leases.lease_of(rec.task_id)
            owner = {"owner": lease.owner if lease else None,
                     "partition": lease.partition if lease else None,
                     "lease_token": lease.token if lease else None,
                     # the store's lease time is not wall time: as this node's wall time
                     "lease_expires_at": self.clock.now() + lease.ttl_left if lease else None,
                     "answered_by": self.node_id}
        beats = await self.store.heartbeats(rec.task_id)  # ctx.heartbeat, no checkpoint
        step = next((b["fraction"] for b in beats if not b["scope"]
                     and b["step"] == rec.current_node), None)
        return {**snapshot, "current_node": rec.current_node, **owner,
                "live": self.system.lookup(task_actor_name(rec.task_id)) is not None,
                "last_heartbeat": rec.updated_at, "budget": rec.budget, "spent": rec.spent,
                "heartbeats": beats, "percent": 100 if rec.status == "SUCCEEDED" else
                task_percent(rec.next_step, rec.steps_total, step)}

    @staticmethod
    def _int_arg(cmd: AdminCommand, name: str, default: int, low: int = 0,
                 high: int | None = None) -> int:
        """``args[name]``, an integer in ``[low, high]`` (``default`` when absent or nil);
        anything else — a float, a string, a bool, a value out of range — is refused, not
        coerced nor clamped."""
        value = cmd.args.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidMessage(f"args.{name} must be an integer", field=name)
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise InvalidMessage(f"args.{name} must be {bounds}", field=name, value=value)
        return value

    @staticmethod
    def _str_arg(cmd: AdminCommand, name: str, *, required: bool = False,
                 max_length: int = 2000) -> str | None:
        """``args[name]``, a str of 1 to ``max_length`` characters (None when absent or
        nil, unless ``required``); anything else is refused."""
        value = cmd.args.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not 1 <= len(value) <= max_length:
            raise InvalidMessage(f"args.{name} must be a string of 1 to {max_length}"
                                 " characters", field=name)
        return value

    async def _history(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        rec = await self._task(tenant, cmd)
        after = self._int_arg(cmd, "after", 0)
        limit = self._int_arg(cmd, "limit", 500, low=1, high=5000)
        events = (await self.store.events(rec.task_id, after))[:limit]
        return {"task_id": rec.task_id, "events": events,
                "next_after": events[-1]["sequence"] if len(events) == limit else None}

    async def _list(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        limit = self._int_arg(cmd, "limit", 100, low=1, high=1000)
        status, workflow = self._str_arg(cmd, "status"), self._str_arg(cmd, "workflow")
        cursor_arg = cmd.args.get("cursor")
        try:
            if cursor_arg is not None:
                if not isinstance(cursor_arg, str) or "/" not in cursor_arg:
                    raise ValueError
                float(cursor_arg.partition("/")[0])
        except ValueError:
            raise InvalidMessage("args.cursor must be a cursor from a previous page") from None
        page, cursor = await self.store.list_tasks(
            tenant, status=status, workflow=workflow, limit=limit, cursor=cursor_arg)
        return {"tasks": page, "next_cursor": cursor}

    async def _model_stats(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Agent model calls compared by node, model, version and configuration (the
        parameters sent): calls, tokens, cost, answers from the cache; over the tenant's
        ``limit`` most recent calls (optionally of one ``workflow``'s tasks)."""
        limit = self._int_arg(cmd, "limit", 5000, low=1, high=50_000)
        workflow = self._str_arg(cmd, "workflow")
        calls = await self.store.model_calls(tenant, limit)
        if workflow is not None:
            mine = {r.task_id for r in calls}
            kept = {t for t in mine if (await self.store.load_task(t)).workflow == workflow}
            calls = [r for r in calls if r.task_id in kept]
        return {"calls": len(calls), "groups": model_stats(calls)}

    async def _handoff(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        rec = await self._task(tenant, cmd)
        return {"task_id": rec.task_id, "handoffs": await self.store.handoffs(rec.task_id)}

    async def _tree(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """This node's supervision tree (only the tenant's tasks; with a task id, only that
        task — answered by the node that owns it), and which node owns each of the
        tenant's unfinished tasks."""
        if cmd.task_id:
            mine = {(await self._task(tenant, cmd)).task_id}
        else:
            mine = {t for t, ten, _ in await self.store.active_tasks() if ten == tenant}

        async def node(name: str) -> dict[str, Any]:
            ref = self.system.lookup(name)
            out: dict[str, Any] = {"name": name, "alive": ref is not None}
            if ref is None or not ref.supervises:
                return out
            try:
                children = await ref.ask(WhichChildren(), timeout=5.0)
            except RatchetError:
                return out
            kids = []
            for child in children:
                if name == TASKS_ROOT and child["id"] not in mine:
                    continue  # another tenant's task: not shown
                sub = await node(f"{name}/{child['id']}")
                kids.append({**sub, "restarts": child["restarts"], "restart": child["restart"]})
            out["children"] = kids
            return out

        out = {"node": self.node_id, "tree": await node("node")}
        if self.leases is not None:
            owners = {row.partition: row.owner for row in await self.store.leases()}
            out["owners"] = {t: owners.get(partition_of(t, self.leases.partitions))
                             for t in sorted(mine)[:1000]}
        return out
