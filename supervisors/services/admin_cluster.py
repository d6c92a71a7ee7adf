"""The admin service's cluster side: passing a command about a task on to the node that
owns the task, and the cluster verbs ``nodes``, ``drain``, ``undrain``, ``clock-ack`` and
``verify-audit`` (tenant ``_system`` only) — a mixin of
:class:`~supervisors.services.admin.AdminActor`."""

from __future__ import annotations

from typing import Any

from nats.aio.msg import Msg

from ratchet.actors.transport.bus import Bus
from ratchet.persistence.ports import StorePort
from ratchet.protocol.clock import Clock
from ratchet.protocol.clock_guard import ClockGuard
from ratchet.protocol.errors import InvalidMessage, NotFound, Unavailable
from ratchet.protocol.messages import AdminCommand
from ratchet.supervisors.services.authn import Authenticator
from ratchet.supervisors.services.request_service import Forwarded

__all__ = ["ClusterVerbs", "FORWARDED_HEADER", "READ_VERBS"]

#: Verbs that only read: answered by any node if the task's owner cannot be reached.
READ_VERBS = frozenset({"get", "history", "handoff", "list", "tree", "nodes"})
#: Header on a request one node passed on to the task's owner (never passed on twice).
FORWARDED_HEADER = "Ratchet-Forwarded-By"


class ClusterVerbs:
    bus: Bus
    authn: Authenticator
    store: StorePort  # the leases and nodes; the audit chain
    clock: Clock
    node_id: str
    leases: Any  # supervisors.node.leases.LeaseManager (None: one node owns all)

    def direct_subject(self) -> str | None:
        return f"ratchet.node.{self.node_id}.admin.*.*"

    async def _forward_if_elsewhere(self, tenant: str, verb: str, task_id: str,
                                    msg: Msg) -> None:
        """Pass a command about a task on to the node that owns the task's partition (it
        holds the live actor and is the only one allowed to write for it); it replies to
        the requester directly. Raises :class:`Forwarded` once passed on."""
        if self.leases is None or self.leases.owns(task_id):
            return
        lease = await self.leases.lease_of(task_id)
        forwarded_by = (msg.headers or {}).get(FORWARDED_HEADER)
        owner_alive = lease is not None and lease.owner is not None and lease.ttl_left > 0
        if owner_alive and lease is not None and lease.owner != self.node_id \
                and forwarded_by is None:
            await self._pass_on(lease.owner, tenant, verb, msg)
        if verb in READ_VERBS:
            return  # a read: the store has the truth; only "live" is unknown here
        raise Unavailable("the task's partition is changing owners; retry shortly",
                          task_id=task_id, owner=lease.owner if lease else None)

    async def _nodes(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        leases = await self.store.leases()
        now = self.clock.now()
        ttl = self.leases.settings.ttl if self.leases else 5.0
        nodes = []
        for row in await self.store.nodes():
            held = [lease.partition for lease in leases
                    if lease.owner == row.node_id and lease.ttl_left > 0]
            nodes.append({"node_id": row.node_id, "status": row.status,
                          "alive": row.status != "stopped" and row.age < ttl,
                          "heartbeat_at": row.heartbeat_at, "started_at": row.started_at,
                          "heartbeat_age_s": round(row.age, 3),
                          "partitions": held, "info": row.info})
        # Lease times are the store's, not wall time: shown as seconds left, and as this
        # node's wall time plus those.
        return {"nodes": nodes, "leases": [
            {"partition": lease.partition, "owner": lease.owner, "token": lease.token,
             "ttl_left_s": round(lease.ttl_left, 3), "expires_at": now + lease.ttl_left,
             "previous_owner": lease.previous_owner}
            for lease in leases]}

    async def _set_node_status(self, cmd: AdminCommand, status: str) -> dict[str, Any]:
        node = cmd.args.get("node")
        if not isinstance(node, str) or not node:
            raise InvalidMessage("this verb needs args.node", field="node")
        if not await self.store.set_node_status(node, status):
            raise NotFound("no such node", node=node)
        return {"node": node, "status": status,
                "effect": "its partitions are handed over at its next heartbeat"
                if status == "draining" else "it takes a share of partitions again"}

    async def _drain(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Hand a node's partitions over cleanly: its tasks stop at a safe point and resume
        on the other nodes; it keeps serving requests but runs no task until undrained or
        restarted."""
        return await self._set_node_status(cmd, "draining")

    async def _undrain(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        return await self._set_node_status(cmd, "active")

    async def _forward_to_node(self, tenant: str, verb: str, cmd: AdminCommand,
                               msg: Msg) -> None:
        """Pass a command about one node (``args.node``) on to that node, which replies to
        the requester directly. Raises :class:`Forwarded` once passed on."""
        node = cmd.args.get("node")
        if not isinstance(node, str) or not node:
            raise InvalidMessage("this verb needs args.node", field="node")
        if node == self.node_id or (msg.headers or {}).get(FORWARDED_HEADER):
            return
        if not any(row.node_id == node for row in await self.store.nodes()):
            raise NotFound("no such node", node=node)
        await self._pass_on(node, tenant, verb, msg)

    async def _pass_on(self, node: str, tenant: str, verb: str, msg: Msg) -> None:
        """Publish the request, as signed by its sender, on ``node``'s own subject, sealed
        by this node (the receiver takes only sealed ones there); raises Forwarded."""
        subject = f"ratchet.node.{node}.admin.{tenant}.{verb}"
        await self.bus.nc.publish(subject, msg.data, reply=msg.reply, headers={
            **(msg.headers or {}), FORWARDED_HEADER: self.node_id,
            **self.authn.seal_headers(subject, msg.data)})
        raise Forwarded()

    async def _clock_ack(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """An operator confirms this node's wall clock after a step: the timers and
        deadlines the step made due are judged by the new time from now on."""
        if cmd.args.get("node") != self.node_id:
            raise NotFound("the node is not this one", node=cmd.args.get("node"))
        released = self.clock.acknowledge() if isinstance(self.clock, ClockGuard) else 0.0
        return {"node": self.node_id, "released_s": round(released, 3),
                "effect": "timers and deadlines are judged by the wall clock again"
                if released else "nothing was held"}

    async def _verify_audit(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Check the audit chain against the key and the head of this node's state
        directory (shared by the nodes of one store): ``{ok, entries, head_seq, problems:
        [{seq, problem}], more_problems}``. A broken chain is an answer, not an error."""
        return (await self.store.verify_audit()).to_wire()
