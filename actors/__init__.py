"""The actor core, the JetStream bus, workflows, the task actor and the client.

Its names are imported at their first use (PEP 562): a process that needs one part does
not pay for the others at start (docs/operations.md, "Restart (W4)")."""

from typing import TYPE_CHECKING

from ratchet.protocol.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from ratchet.actors.core.actor import Actor, ActorRef, ActorSystem
    from ratchet.actors.transport.client import Client
    from ratchet.actors.workflow.registry import Registry, StepContext, Workflow

__all__ = [
    "Client",
    "Actor",
    "ActorRef",
    "ActorSystem",
    "Registry",
    "StepContext",
    "Workflow",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "ratchet.actors.core.actor": ("Actor", "ActorRef", "ActorSystem"),
    "ratchet.actors.transport.client": ("Client",),
    "ratchet.actors.workflow.registry": ("Registry", "StepContext", "Workflow"),
}, globals(), __all__)
