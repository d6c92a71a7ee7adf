"""The actor core, the JetStream bus, workflows, the task actor and the client."""

from ratchet.actors.client import Client, RemoteError
from ratchet.actors.core import Actor, ActorCrashed, ActorRef, ActorStopped, ActorSystem, AskTimeout
from ratchet.actors.workflow import Registry, StepContext, Workflow, WorkflowDefinitionError

__all__ = [
    "Client",
    "RemoteError",
    "Actor",
    "ActorCrashed",
    "ActorRef",
    "ActorStopped",
    "ActorSystem",
    "AskTimeout",
    "Registry",
    "StepContext",
    "Workflow",
    "WorkflowDefinitionError",
]
