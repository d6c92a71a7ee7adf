"""The actor core, the JetStream bus, workflows, the task actor and the client."""

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
