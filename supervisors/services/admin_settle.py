"""The admin service's verbs for settling what a machine could not — ``resolve``,
``retry-action``, ``skip-step`` (role approver), ``retry-branch`` (role operator) and
``approvals`` (role viewer) — and what
``get`` adds for a task waiting for a human: a mixin of
:class:`~supervisors.services.admin.AdminActor`. Like every verb they are role-checked,
deduplicated by command id and audited (requested, then the outcome) by
``AdminActor.answer``; a task of another tenant is NOT_FOUND.

``resolve`` and ``retry-action`` are bound to the action's request hash: the command names
the hash its sender saw (in the handoff package, ``admin handoff``), and another one is
refused (CONFLICT) — a human settles the request they looked at, not whatever the key
holds now. The task's actor applies them (``task.settle`` mail, actors/task/settle.py) and
checks them again; request and reply shapes: docs/admin.md.
"""

from __future__ import annotations

from typing import Any

from ratchet.actors.workflow.nodes import ApprovalNode
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.errors import (
    CommandConflict,
    IllegalTransition,
    InvalidMessage,
    NotFound,
    RatchetError,
)
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import AdminCommand, Envelope
from ratchet.protocol.states import TaskStatus
from ratchet.supervisors.services.admin_reads import ReadVerbs
from ratchet.supervisors.supervision.tasks import TaskSupervision

__all__ = ["SettleVerbs"]

_OUTCOMES = ("succeeded", "failed", "compensated")
_WAITING = (TaskStatus.UNKNOWN.value, TaskStatus.WAITING_APPROVAL.value)
#: The refusals the task answers (``refused:<CODE>: why``), as the reply's error.
_REFUSALS: dict[str, type[RatchetError]] = {
    "NOT_FOUND": NotFound, "CONFLICT": CommandConflict, "INVALID_ARGUMENT": InvalidMessage}


class SettleVerbs(ReadVerbs):
    tasks: TaskSupervision

    async def _tell_task(self, rec: Any, env: Envelope) -> Any:
        raise NotImplementedError  # AdminActor's

    @staticmethod
    def _who(cmd: AdminCommand) -> str:
        raise NotImplementedError  # AdminActor's

    async def _settle(self, tenant: str, cmd: AdminCommand, verb: str,
                      body: dict[str, Any]) -> dict[str, Any]:
        """Check what the store can tell (the task waits for a human; the action is the
        task's, with the hash named), then have the task's actor apply it."""
        rec = await self._task(tenant, cmd)
        if rec.status not in _WAITING:
            raise IllegalTransition(f"the task is {rec.status}, not waiting for a human",
                                    status=rec.status)
        if "key" in body:
            row = await self.store.get_action(tenant, body["key"])
            if row is None or row.task_id != rec.task_id:
                raise NotFound("no such action of this task", action=body["key"])
            if row.request_hash != body["request_hash"]:
                raise CommandConflict("the action's request hash is not the one named",
                                      action=body["key"])
        answer = str(await self._tell_task(rec, Envelope(
            type=MessageType.TASK_SETTLE, message_id=new_id("msg"),
            correlation_id=cmd.command_id, body={"verb": verb, "by": self._who(cmd), **body})))
        if answer.startswith("refused:"):
            code, _, why = answer.removeprefix("refused:").partition(": ")
            raise _REFUSALS.get(code, IllegalTransition)(why, task_id=rec.task_id)
        if not answer.startswith("processed"):
            raise IllegalTransition(f"not applied: {answer}", task_id=rec.task_id)
        after = await self.store.load_task(rec.task_id)
        return {"task_id": rec.task_id, "status": after.status,
                "then": answer.removeprefix("processed: "), **{k: body[k] for k in body
                                                               if k in ("key", "outcome")}}

    def _bound(self, cmd: AdminCommand) -> dict[str, Any]:
        key = self._str_arg(cmd, "action", required=True, max_length=512)
        digest = self._str_arg(cmd, "request_hash", required=True, max_length=256)
        return {"key": key, "request_hash": digest}

    async def _resolve(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Settle an action with the human's evidence: ``args.action`` (its key),
        ``args.outcome``, ``args.evidence``, ``args.request_hash``; for ``succeeded``,
        ``args.result`` (the provider's result, validated against the tool's model) and
        optionally ``args.provider_id``."""
        outcome = self._str_arg(cmd, "outcome", required=True, max_length=32)
        if outcome not in _OUTCOMES:
            raise InvalidMessage(f"args.outcome must be one of {', '.join(_OUTCOMES)}",
                                 field="outcome")
        evidence = self._str_arg(cmd, "evidence", required=True, max_length=4000)
        result = cmd.args.get("result")
        if result is not None and (outcome != "succeeded" or not isinstance(result, dict)):
            raise InvalidMessage("args.result is a map, for outcome succeeded", field="result")
        return await self._settle(tenant, cmd, "resolve", {
            **self._bound(cmd), "outcome": outcome, "evidence": evidence, "result": result,
            "provider_id": self._str_arg(cmd, "provider_id", max_length=512)})

    async def _retry_action(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Re-send a write of unknown outcome under its idempotency key, once a human
        checked the provider has no record of it: ``args.action``, ``args.request_hash``,
        optionally ``args.evidence``."""
        return await self._settle(tenant, cmd, "retry-action", {
            **self._bound(cmd), "evidence": self._str_arg(cmd, "evidence", max_length=4000)})

    async def _skip_step(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Move a task at a handoff past its current step, when the workflow declares the
        step ``skippable``; optionally ``args.reason``."""
        return await self._settle(tenant, cmd, "skip-step", {
            "reason": self._str_arg(cmd, "reason", max_length=2000)})

    async def _retry_branch(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Run one failed (or timed-out) branch of a fan-out again, from its last committed
        step, while its join has not decided: ``args.fanout`` (the fan-out's key,
        ``<node>#<visit>``, or its node's name) and ``args.branch``. The task's actor
        reopens the row and answers (actors/task/branch_retry.py)."""
        rec = await self._task(tenant, cmd)
        if rec.status != TaskStatus.RUNNING.value:
            raise IllegalTransition(f"the task is {rec.status}, not RUNNING", status=rec.status)
        fanout = self._str_arg(cmd, "fanout", required=True, max_length=512)
        branch = self._str_arg(cmd, "branch", required=True, max_length=512)
        answer = str(await self._tell_task(rec, Envelope(
            type=MessageType.TASK_CONTROL, message_id=new_id("msg"),
            correlation_id=cmd.command_id, body={"action": "retry-branch", "request": {
                "fanout": fanout, "branch": branch, "by": self._who(cmd)}})))
        if answer.startswith("refused:"):
            code, _, why = answer.removeprefix("refused:").partition(": ")
            raise _REFUSALS.get(code, IllegalTransition)(why, task_id=rec.task_id)
        if answer != "retried":
            raise IllegalTransition(f"not applied: {answer}", task_id=rec.task_id)
        return {"task_id": rec.task_id, "fanout": fanout, "branch": branch, "status": answer}

    async def _approvals(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """The tenant's pending approvals and open handoffs, oldest first, with their age
        in seconds; at most ``args.limit`` (default 100)."""
        limit = self._int_arg(cmd, "limit", 100, low=1, high=1000)
        now = self.clock.now()
        rows = await self.store.awaiting_humans(tenant, limit)
        return {"waiting": [{**r, "age_s": round(max(0.0, now - r["created_at"]), 3)}
                            for r in rows], "now": now}

    async def _get(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """``get``, plus, for a task waiting for a human, ``waiting_for``: the pending
        approval's id, request hash, deadline and escalation target, and the open handoff's
        reason."""
        out = await super()._get(tenant, cmd)
        if out.get("status") not in _WAITING:
            return out
        rec = await self._task(tenant, cmd)
        waiting: dict[str, Any] = {}
        pending = await self.store.pending_approval(rec.task_id)
        if pending is not None:
            waiting.update(approval_id=pending["approval_id"], node=pending["node"],
                           request_hash=pending["request_hash"],
                           approvers=pending["approvers"] or None,
                           deadline=pending["expires_at"],
                           escalation=self._escalation(rec, pending["node"]))
        handoffs = [h for h in await self.store.handoffs(rec.task_id)
                    if h["resolved_at"] is None]
        if handoffs:
            package = handoffs[-1]["package"] or {}
            waiting.update(handoff_id=handoffs[-1]["id"], reason=handoffs[-1]["reason"],
                           since=handoffs[-1]["created_at"],
                           recommended=package.get("recommended"))
        return {**out, "waiting_for": waiting or None}

    def _escalation(self, rec: Any, node: str) -> str | None:
        """Where an approval node escalates when no one decides in time (``on_timeout``: a
        node, or ``cancel``); None for the runtime's own approvals (they do not expire)."""
        try:
            workflow = self.tasks.deps.registry.get(rec.workflow, rec.workflow_version)
        except RatchetError:
            return None
        found = workflow.nodes.get(node)
        return found.on_timeout if isinstance(found, ApprovalNode) else None
