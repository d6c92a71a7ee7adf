"""The actor core, the JetStream bus, workflows, the task actor and the client."""

from ratchet.actors.client import Client
from ratchet.actors.core import Actor, ActorRef, ActorSystem
from ratchet.actors.workflow import Registry, StepContext, Workflow

__all__ = [
    "Client",
    "Actor",
    "ActorRef",
    "ActorSystem",
    "Registry",
    "StepContext",
    "Workflow",
]
