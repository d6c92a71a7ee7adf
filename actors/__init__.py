"""The actor core, the JetStream bus, workflows, the task actor and the client."""

from actors.client import Client, RemoteError
from actors.core import Actor, ActorCrashed, ActorRef, ActorStopped, ActorSystem, AskTimeout
from actors.workflow import Registry, StepContext, Workflow, WorkflowDefinitionError

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
