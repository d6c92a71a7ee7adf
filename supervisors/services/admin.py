"""The admin service: operators' commands on ``ratchet.admin.<tenant>.<verb>``.

Verbs: ``get``, ``history``, ``list``, ``tree``, ``handoff``; ``cancel``, ``pause``, ``resume``
(actors/task/control.py); ``approve``, ``reject``; ``fork``; ``restart``; the kill switches
(``disable-tool``, ``enable-tool``, ``freeze``, ``thaw``: a tenant's, or every tenant's on
``_system``); and ``purge``. Every verb follows one contract: a typed reply; a signed
command whose key holds the role the verb needs (supervisors/services/authn.py:
UNAUTHENTICATED or PERMISSION_DENIED otherwise; the payload's ``principal`` decides
nothing); the tenant of the subject (another tenant's task is NOT_FOUND: no existence
leak); a command id (a repeat returns the first answer, the same id with another request
is CONFLICT); an audit entry, hash-chained, before the effect and with its outcome.
Mixins of :class:`AdminActor` hold the others (supervisors/services/admin_<name>.py): reads,
diagnose, dlq, history (state, diff, bisect), cluster, keys, schedules, settle, versions, sandbox.
"""

from __future__ import annotations

from typing import Any

import structlog
from nats.aio.msg import Msg

from ratchet.actors.core.actor import ActorSystem
from ratchet.actors.effects.switches import Switches
from ratchet.actors.task.actor import DeliverMail
from ratchet.actors.transport.bus import Bus
from ratchet.persistence.admin_rows import AuditEntry
from ratchet.persistence.fork import ForkRequest
from ratchet.persistence.ports import StorePort
from ratchet.persistence.txns import NewTask, TaskChange
from ratchet.protocol.admin_verbs import ANY_SCOPE, CLUSTER_VERBS, SYSTEM_TENANT, VERB_ROLES
from ratchet.protocol.auth import Principal
from ratchet.protocol.catalogue import EventType, MessageType, admin_type
from ratchet.protocol.clock import Clock
from ratchet.protocol.codec import canonical, encode, parse_body
from ratchet.protocol.errors import (
    ActorStopped,
    CommandConflict,
    ErrorCode,
    IllegalTransition,
    InvalidMessage,
    NotFound,
    PermissionDenied,
    RatchetError,
    TaskFinished,
    Unavailable,
)
from ratchet.protocol.ids import new_id, request_hash
from ratchet.protocol.messages import AdminCommand, Envelope, StartTask
from ratchet.protocol.messages import Principal as WirePrincipal
from ratchet.protocol.redaction import REDACTED, redact
from ratchet.protocol.states import TaskStatus, is_terminal
from ratchet.protocol.subjects import mail_subject
from ratchet.supervisors.services.admin_cluster import ClusterVerbs
from ratchet.supervisors.services.admin_diagnose import DiagnoseVerbs
from ratchet.supervisors.services.admin_dlq import DlqVerbs
from ratchet.supervisors.services.admin_history import HistoryVerbs
from ratchet.supervisors.services.admin_keys import KeyringHooks, KeyVerbs
from ratchet.supervisors.services.admin_reads import ReadVerbs
from ratchet.supervisors.services.admin_sandbox import SandboxVerbs
from ratchet.supervisors.services.admin_schedules import ScheduleVerbs
from ratchet.supervisors.services.admin_settle import SettleVerbs
from ratchet.supervisors.services.admin_versions import VersionVerbs
from ratchet.supervisors.services.authn import Authenticator
from ratchet.supervisors.services.request_service import RequestService
from ratchet.supervisors.supervision.supervisor import RestartChild
from ratchet.supervisors.supervision.tasks import (
    TaskSupervision,
    task_actor_name,
    task_supervisor_name,
)

__all__ = ["AdminActor", "CLUSTER_VERBS", "SYSTEM_TENANT", "VERB_ROLES"]

log = structlog.get_logger("ratchet.admin")

#: The event that records an operator's request, by the request's action.
_REQUESTED = {"cancel": EventType.TASK_CANCEL_REQUESTED, "pause": EventType.TASK_PAUSE_REQUESTED}
#: What the reply says follows a request (docs/admin.md, "Cancel, pause, resume").
_EFFECTS = {
    "cancel": "at once: a running step is interrupted, nothing of it committed (a write in"
              " flight is waited for, up to the cancel timeout; an agent's tool calls finish"
              " first); the task ends CANCELLED, after its compensations if the workflow"
              " asks for them",
    "pause": "at the task's next safe point: when its running step ends, or before its next"
             " tool call",
}


class AdminActor(SettleVerbs, DiagnoseVerbs, DlqVerbs, ReadVerbs, HistoryVerbs, ClusterVerbs,
                 KeyVerbs, ScheduleVerbs, VersionVerbs, SandboxVerbs, RequestService):
    subject = "ratchet.admin.*.*"
    queue = "ratchet-admin"
    store: StorePort  # spans tasks, administration and the lease table (ClusterVerbs)

    def __init__(self, bus: Bus, authn: Authenticator, store: StorePort, system: ActorSystem,
                 clock: Clock, node_id: str, tasks: TaskSupervision, switches: Switches,
                 leases: Any = None, keyring: KeyringHooks | None = None) -> None:
        super().__init__(bus, authn)
        self.keyring = keyring or KeyringHooks()
        self.leases = leases  # supervisors.node.leases.LeaseManager (None: one node owns all)
        self.store = store
        self.tasks = tasks
        self.switches = switches
        self.system = system
        self.clock = clock
        self.node_id = node_id

    async def answer(self, tenant: str, verb: str, env: Envelope, msg: Msg,
                     who: Principal) -> dict[str, Any]:
        if verb not in VERB_ROLES or env.type != admin_type(verb):
            raise InvalidMessage(f"unknown admin verb {verb!r} (type {env.type!r})", verb=verb)
        cmd = parse_body(env, AdminCommand)
        if (verb in CLUSTER_VERBS) != (tenant == SYSTEM_TENANT) and verb not in ANY_SCOPE:
            raise PermissionDenied(f"{verb} is not a command of tenant {tenant!r}", verb=verb)
        if cmd.task_id:
            await self._forward_if_elsewhere(tenant, verb, cmd.task_id, msg)
        elif verb == "clock-ack":
            await self._forward_to_node(tenant, verb, cmd, msg)
        # Who acts is the verified key's principal (supervisors/services/authn.py, which
        # also checked the verb's role); the payload's ``principal`` is ignored. The key is
        # in the digest: another principal cannot read a command's answer by its id.
        cmd = cmd.model_copy(update={"principal": WirePrincipal(name=who.name)})
        digest = request_hash(canonical({"verb": verb, "body": cmd.model_dump(),
                                         "key": who.public_key}))
        state, stored = await self.store.claim_command(tenant, cmd.command_id, verb, digest,
                                                       self.clock.now())
        if state == "conflict":
            raise CommandConflict("command id already used for another request",
                                  command_id=cmd.command_id)
        if state == "repeat" and stored is not None:
            return self._replay(stored)
        if state == "repeat":
            raise Unavailable("a request with this command id is still running; retry",
                              command_id=cmd.command_id)
        await self._audit(tenant, who.name, verb, cmd, "requested",
                          {"args": await self._shown_args(tenant, cmd)})
        try:
            result: dict[str, Any] = await getattr(self, f"_{verb.replace('-', '_')}")(tenant,
                                                                                       cmd)
        except RatchetError as exc:
            await self._audit(tenant, who.name, verb, cmd, exc.code.value,
                              {"error": exc.message})
            if exc.retryable:  # a retry with the same id must run again, not replay this
                await self.store.release_command(tenant, cmd.command_id)
            else:
                await self.store.store_command_reply(tenant, cmd.command_id,
                                                     {"ok": False, "error": exc.to_wire()})
            raise
        except Exception as exc:
            await self._audit(tenant, who.name, verb, cmd, "INTERNAL",
                              {"error": repr(exc)[:500]})
            await self.store.release_command(tenant, cmd.command_id)
            raise
        await self._audit(tenant, who.name, verb, cmd, "ok", {})
        await self.store.store_command_reply(tenant, cmd.command_id, {"ok": True,
                                                                      "result": result})
        return result

    @staticmethod
    def _who(cmd: AdminCommand) -> str:
        """The verified principal's name (:meth:`answer` put it in the command)."""
        return cmd.principal.name if cmd.principal is not None else "unknown"

    def _replay(self, stored: dict[str, Any]) -> dict[str, Any]:
        if stored.get("ok"):
            return dict(stored["result"])
        error = stored["error"]
        replayed = RatchetError(error["message"], retryable=error.get("retryable", False))
        replayed.details = dict(error.get("details") or {})
        replayed.code = ErrorCode(error["code"])
        raise replayed

    async def _audit(self, tenant: str, who: str, verb: str, cmd: AdminCommand, outcome: str,
                     detail: dict[str, Any]) -> None:
        await self.store.audit(AuditEntry(tenant, self.clock.now(), who, verb, cmd.command_id,
                                          cmd.task_id, outcome, detail))

    async def _shown_args(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """A command's arguments as the audit keeps them: a new input (``fork``) has the
        secret fields of its workflow's ``input_model`` redacted — all of it when it cannot
        be told apart (an unknown task or workflow, an input that does not validate)."""
        if "input" not in cmd.args:
            return cmd.args
        try:
            rec = await self._task(tenant, cmd)
            workflow = self.tasks.deps.registry.get(rec.workflow, rec.workflow_version)
            shown = redact(workflow.parse_input(cmd.args["input"]))
        except (RatchetError, TypeError):
            shown = REDACTED
        return {**cmd.args, "input": shown}

    def _check_version(self, rec: Any, cmd: AdminCommand) -> None:
        if cmd.expected_version is not None and cmd.expected_version != rec.version:
            raise CommandConflict("the task moved on", expected=cmd.expected_version,
                                  actual=rec.version)

    async def _request(self, rec: Any, cmd: AdminCommand, action: str) -> dict[str, Any]:
        """Record the operator's request on the task (before it takes effect), then tell its
        actor, activating it if it is parked. Answers at once; the effect follows as
        ``_EFFECTS`` says."""
        request = {"by": self._who(cmd), "reason": self._str_arg(cmd, "reason"),
                   "at": self.clock.now(), "command_id": cmd.command_id}
        await self.store.apply(TaskChange(
            task_id=rec.task_id, expected_version=None, producer=self.node_id,
            now=self.clock.now(), control={**rec.control, action: request},
            events=[(_REQUESTED[action], request)]))
        live = self.system.lookup(task_actor_name(rec.task_id))
        if live is not None and action == "cancel":
            live.interrupt()  # a running step is abandoned, not waited for
        elif live is not None and action == "pause":
            live.request_pause()  # the next tool call is a safe point too
        try:
            ref = await self.tasks.ensure_running(rec.task_id)
        except TaskFinished:
            return {"task_id": rec.task_id, "status": f"{action} requested", "effect": "none:"
                    " the task finished first"}
        if ref is not None:
            ref.tell(DeliverMail(Envelope(type=MessageType.TASK_CONTROL, message_id=new_id("msg"),
                                          correlation_id=cmd.command_id,
                                          body={"action": action, "request": request})))
        return {"task_id": rec.task_id, "status": f"{action} requested",
                "effect": _EFFECTS[action]}

    async def _tell_task(self, rec: Any, env: Envelope) -> Any:
        """Deliver ``env`` to the task's actor, activating it, and return its answer. A
        parked task's actor may be stopping as it is found (a timer's mail just left it
        parked, e.g. a sleep's while PAUSED): a fresh one is activated once."""
        for last in (False, True):
            ref = await self.tasks.ensure_running(rec.task_id, record=rec)
            if ref is None:
                raise Unavailable("the task is between restarts; try again", task_id=rec.task_id)
            try:
                return await ref.ask(DeliverMail(env), timeout=30.0)
            except ActorStopped:
                if last:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    # -- verbs -------------------------------------------------------------------------------

    async def _approve(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        return await self._decide(tenant, cmd, "approve")

    async def _reject(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        return await self._decide(tenant, cmd, "reject")

    async def _decide(self, tenant: str, cmd: AdminCommand, decision: str) -> dict[str, Any]:
        """Wraps the approval decision message: the task re-validates the one-time id, the
        expiry, the node and the request hash just before acting on it."""
        rec = await self._task(tenant, cmd)
        self._check_version(rec, cmd)
        approval_id = self._str_arg(cmd, "approval_id", required=True, max_length=128)
        assert approval_id is not None
        expected_hash = self._str_arg(cmd, "request_hash", max_length=256)
        reason = self._str_arg(cmd, "reason")
        row = await self.store.approval(approval_id)
        if row is None or row["task_id"] != rec.task_id:
            raise NotFound("no such approval for this task", approval_id=approval_id)
        if row["status"] != "PENDING":
            raise IllegalTransition(f"approval already {row['status'].lower()}",
                                    approval_id=approval_id)
        if row["expires_at"] is not None and self.clock.due_now() > row["expires_at"]:
            raise IllegalTransition("approval expired", approval_id=approval_id)
        if expected_hash is not None and expected_hash != row["request_hash"]:
            raise CommandConflict("the request changed since it was shown",
                                  approval_id=approval_id)
        outcome = await self._tell_task(rec, Envelope(
            type=MessageType.APPROVAL_DECISION, message_id=new_id("msg"),
            correlation_id=cmd.command_id,
            body={"task_id": rec.task_id, "approval_id": approval_id, "decision": decision,
                  "decided_by": self._who(cmd), "reason": reason,
                  "request_hash": row["request_hash"]}))
        if outcome != "processed":
            raise IllegalTransition(f"decision not applied: {outcome}", approval_id=approval_id)
        return {"task_id": rec.task_id, "approval_id": approval_id, "decision": decision}

    # Kill switches act on the subject's tenant's tasks (``_system``: every tenant's), on
    # every node of the store; persisted before they take effect and, like every command,
    # audited. Other nodes see the change at their next lease tick (node.py).

    async def _disable_tool(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        return await self._switch_tool(tenant, cmd, True)

    async def _enable_tool(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        return await self._switch_tool(tenant, cmd, False)

    async def _switch_tool(self, scope: str, cmd: AdminCommand, off: bool) -> dict[str, Any]:
        tool = self._str_arg(cmd, "tool", required=True, max_length=200)
        assert tool is not None
        await self.store.set_switch(scope, "tool", tool, off, self._who(cmd),
                                    self._str_arg(cmd, "reason") if off else None,
                                    self.clock.now())
        self.switches.set_tool(scope, tool, off)
        return {"disabled": self.switches.disabled(scope)}

    async def _freeze(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        await self.store.set_switch(tenant, "freeze", "dispatch", True, self._who(cmd),
                                    self._str_arg(cmd, "reason"), self.clock.now())
        self.switches.set_frozen(tenant, True)
        return {"frozen": True, "scope": tenant,
                "effect": "running steps finish; no new step starts"}

    async def _thaw(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        await self.store.set_switch(tenant, "freeze", "dispatch", False, self._who(cmd), None,
                                    self.clock.now())
        self.switches.set_frozen(tenant, False)
        # Tasks at their safe point go on; those the cluster's freeze holds check and wait.
        return {"frozen": self.switches.frozen_for(tenant), "scope": tenant,
                "woken": self.tasks.wake_all()}

    async def _breakers(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """This node's circuit breakers for the tenant (``_system``: every tenant's): the
        providers that failed lately or are open. Breakers are per node (the answer says
        which node); a closed breaker with no recent failure is not listed."""
        scope = None if tenant == SYSTEM_TENANT else tenant
        return {"node_id": self.node_id,
                "breakers": self.switches.breakers.snapshot(scope, self.clock.monotonic())}

    async def _purge(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Remove one finished task (events, checkpoints, unreferenced blobs) on demand."""
        rec = await self._task(tenant, cmd)
        if not is_terminal(TaskStatus(rec.status)):
            raise IllegalTransition(f"only a finished task can be purged, not {rec.status}",
                                    status=rec.status)
        return {"task_id": rec.task_id, "removed": await self.store.purge_task(rec.task_id)}

    async def _fork(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Retry from a historical checkpoint as a new task (``fork_of`` the original),
        optionally with changed input; the original's history is untouched."""
        rec = await self._task(tenant, cmd)
        new_input = cmd.args.get("input", rec.input)
        if not isinstance(new_input, dict):
            raise InvalidMessage("args.input must be a map")
        if "input" in cmd.args:  # validated as a submission's (its secrets become SecretStr)
            workflow = self.tasks.deps.registry.get(rec.workflow, rec.workflow_version)
            new_input = workflow.parse_input(new_input)
        sealed = self.store.secrets.canonical  # the stored input keeps its secrets sealed
        task_id, now = new_id("tsk"), self.clock.now()
        start = Envelope(type=MessageType.TASK_START, message_id=new_id("msg"),
                         correlation_id=cmd.command_id, sent_at=now,
                         body=StartTask(task_id=task_id, tenant=tenant).model_dump())
        checkpoint = (None if cmd.args.get("checkpoint") is None
                      else self._int_arg(cmd, "checkpoint", 0, low=0))
        new = NewTask(
            task_id=task_id, tenant=tenant, workflow=rec.workflow,
            workflow_version=rec.workflow_version, idempotency_key=f"fork:{task_id}",
            request_hash=request_hash(sealed({"fork_of": rec.task_id, "input": new_input,
                                              "checkpoint": checkpoint})),
            input=sealed(new_input), steps_total=rec.steps_total, deadline_at=None,
            now=now, producer=self.node_id, message_id=cmd.command_id,
            start_mail=(mail_subject(task_id, "task", self.tasks.deps.partitions),
                        start.message_id, encode(start)))
        return await self.store.fork(ForkRequest(rec.task_id, checkpoint, new, self._sandbox(cmd)))

    async def _restart(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Restart one task's actor through its supervisor (a fresh actor from the last
        checkpoint); counts against the supervisor's restart intensity."""
        child = self._str_arg(cmd, "actor", max_length=256) or "actor"  # or a session, branch, join
        rec = await self._task(tenant, cmd)
        sup = self.system.lookup(task_supervisor_name(rec.task_id))
        if sup is None:
            raise IllegalTransition("the task has no live actor to restart",
                                    status=rec.status)
        result = await sup.ask(RestartChild(child), timeout=30.0)
        if not result.get("restarted"):
            raise NotFound(str(result.get("reason")), actor=child)
        return {"task_id": rec.task_id, "actor": child, "restarts": result["restarts"]}

    async def _cancel(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        rec = await self._task(tenant, cmd)
        self._check_version(rec, cmd)
        if is_terminal(TaskStatus(rec.status)):
            raise IllegalTransition(f"cannot cancel a {rec.status} task", status=rec.status)
        return await self._request(rec, cmd, "cancel")

    async def _pause(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        rec = await self._task(tenant, cmd)
        self._check_version(rec, cmd)
        if rec.status not in ("QUEUED", "RUNNING", "SLEEPING"):
            raise IllegalTransition(f"cannot pause a {rec.status} task", status=rec.status)
        return await self._request(rec, cmd, "pause")

    async def _resume(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        rec = await self._task(tenant, cmd)
        self._check_version(rec, cmd)
        if rec.status != "PAUSED":
            raise IllegalTransition(f"cannot resume a {rec.status} task", status=rec.status)
        try:  # the workflow version it was running must still be served here
            self.tasks.deps.registry.get(rec.workflow, rec.workflow_version)
        except RatchetError:
            raise IllegalTransition(f"workflow {rec.workflow} v{rec.workflow_version} is not"
                                    " served by this node", task_id=rec.task_id) from None
        outcome = await self._tell_task(rec, Envelope(
            type=MessageType.TASK_CONTROL, message_id=new_id("msg"), correlation_id=cmd.command_id,
            body={"action": "resume", "request": {"by": self._who(cmd), "accept_definition":
                                                  cmd.args.get("accept_definition") is True}}))
        if str(outcome).startswith("refused"):
            raise IllegalTransition(str(outcome), task_id=rec.task_id)
        return {"task_id": rec.task_id, "status": outcome}
