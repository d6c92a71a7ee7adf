"""The console's write side: a button runs the admin verb of the same name through
``AdminActor.answer`` — the code path of ``ratchet.admin.<tenant>.<verb>`` after its
signature check — as the logged-in principal.

So a decision made in the browser is what ``ratchet admin approve`` does: the verb's role
checked (here, as authn.py does for NATS: the session's key read from the keyring now),
the task's tenant checked (another tenant's task is NOT_FOUND), a fresh command id, an
audit entry with the principal's name written before the command takes effect and again
with its outcome, and the same one-time approval id, expiry and request hash checks.

A task whose partition another node holds is refused here with the owner's name: the
admin service would pass a NATS request on to that node with its sender's signature, and
a console session has no signature to pass on. Open that node's console.
"""

from __future__ import annotations

import json
from typing import Any

from nats.aio.msg import Msg

from ratchet.protocol.admin_verbs import VERB_ROLES
from ratchet.protocol.auth import Principal
from ratchet.protocol.catalogue import admin_type
from ratchet.protocol.errors import InvalidMessage, Unavailable
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import AdminCommand, Envelope
from ratchet.supervisors.console.auth import authorize
from ratchet.supervisors.services.admin import AdminActor
from ratchet.supervisors.services.admin_cluster import FORWARDED_HEADER

__all__ = ["ACTIONS", "Actions"]

#: The buttons of a task page: verb → the form fields it takes (and passes as ``args``).
ACTIONS: dict[str, tuple[str, ...]] = {
    "approve": ("approval_id", "request_hash", "reason"),
    "reject": ("approval_id", "request_hash", "reason"),
    # Settles an action with the human's evidence (supervisors/services/admin_settle.py):
    # bound to the request hash the page showed; ``result`` is JSON (for ``succeeded``).
    "resolve": ("action", "request_hash", "outcome", "evidence", "result"),
    "retry-action": ("action", "request_hash", "evidence"),
    # An operator's control of the task (actors/task/control.py).
    "cancel": ("reason",), "pause": ("reason",), "resume": ("reason",),
}


class Actions:
    def __init__(self, admin: AdminActor, reader: Any) -> None:
        self.admin = admin
        self.reader = reader  # views.Reader: the task's visibility check

    async def run(self, who: Principal, verb: str, task_id: str,
                  form: dict[str, str]) -> dict[str, Any]:
        """Run ``verb`` on ``task_id`` as ``who`` with the form's fields; returns the verb's
        result or raises its RatchetError."""
        if verb not in ACTIONS or verb not in VERB_ROLES:
            raise InvalidMessage(f"the console has no action {verb!r} on this node", verb=verb)
        rec = await self.reader.task(who, task_id)  # NOT_FOUND for another tenant's
        authorize(who, rec.tenant, verb)
        leases = self.admin.leases
        if leases is not None and not leases.owns(rec.task_id):
            lease = await leases.lease_of(rec.task_id)
            owner = lease.owner if lease is not None else None
            raise Unavailable(f"node {owner} runs this task: decide in its console (or with"
                              " `ratchet admin`, which reaches it)", owner=owner)
        args: dict[str, Any] = {name: form[name] for name in ACTIONS[verb] if form.get(name)}
        if isinstance(args.get("result"), str):
            try:
                args["result"] = json.loads(args["result"])
            except ValueError:
                raise InvalidMessage("the result is not JSON", field="result") from None
        cmd = AdminCommand(command_id=new_id("cmd"), task_id=rec.task_id, args=args)
        env = Envelope(type=admin_type(verb), message_id=new_id("msg"),
                       correlation_id=cmd.command_id, body=cmd.model_dump())
        subject = f"ratchet.admin.{rec.tenant}.{verb}"
        # Marked as passed on already: the admin service must not forward it (a node that
        # lost the partition since the check above answers UNAVAILABLE instead).
        msg = Msg(_client=self.admin.bus.nc, subject=subject, reply="", data=b"",
                  headers={FORWARDED_HEADER: "console"})
        result: dict[str, Any] = await self.admin.answer(rec.tenant, verb, env, msg, who)
        return result
