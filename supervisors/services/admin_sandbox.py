"""``admin fork --sandbox``: what a fork's ``sandbox`` and ``reuse_model`` arguments ask
for, a mixin of :class:`~supervisors.services.admin.AdminActor` (the ``fork`` verb itself,
its role, command id and audit are the admin service's, unchanged).

A sandbox fork is an ordinary fork (persistence/fork.py) marked a sandbox in the same
transaction (persistence/sandbox_rows.py): its calls make no write at any provider
(actors/effects/sandbox.py), its events go to ``ratchet.sandbox.events.…`` only, its log
lines carry ``sandbox=True`` (actors/task/sandbox_task.py), and ``get``/``status`` show its
marks. docs/admin.md, "fork --sandbox".
"""

from __future__ import annotations

from ratchet.persistence.sandbox_rows import SandboxFork
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import AdminCommand

__all__ = ["SandboxVerbs"]


class SandboxVerbs:
    @staticmethod
    def _sandbox(cmd: AdminCommand) -> SandboxFork | None:
        """The sandbox a ``fork`` asks for (None: an ordinary fork, unless its source is a
        sandbox: then the fork is one too). Both arguments are booleans; anything else is
        refused, as is ``reuse_model`` without ``sandbox``: recorded model answers in a
        production run would act on what a model said to another run."""
        flags = {}
        for name in ("sandbox", "reuse_model"):
            value = cmd.args.get(name, False)
            if not isinstance(value, bool):
                raise InvalidMessage(f"args.{name} must be true or false", field=name)
            flags[name] = value
        if flags["reuse_model"] and not flags["sandbox"]:
            raise InvalidMessage("args.reuse_model needs args.sandbox", field="reuse_model")
        return SandboxFork(reuse_model=flags["reuse_model"]) if flags["sandbox"] else None
