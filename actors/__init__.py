"""The actor core, the JetStream bus, workflows, the task actor and the client.

Its names are imported at their first use (PEP 562): a process that needs one part does
not pay for the others at start (docs/operations.md, "Restart (W4)")."""

import importlib
from typing import TYPE_CHECKING, Any

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

_WHERE = {name: module for module, names in {
    "ratchet.actors.core.actor": ("Actor", "ActorRef", "ActorSystem"),
    "ratchet.actors.transport.client": ("Client",),
    "ratchet.actors.workflow.registry": ("Registry", "StepContext", "Workflow"),
}.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ratchet.actors' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
