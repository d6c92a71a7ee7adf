"""Ratchet's public API: what workflow authors and clients import.

    import ratchet

    expense = ratchet.Workflow("expense.submit", version=1)

    @expense.step
    async def validate(ctx: ratchet.StepContext):
        return {"amount": ctx.input["amount"]}

    app = ratchet.Registry([expense])      # ratchet serve --app mymodule:app
"""

from actors.actions import ActionFailed
from actors.client import Client, RemoteError
from actors.nodes import CANCEL, END, FAIL, JoinPolicy
from actors.tools import Accepted, Compensation, RetryPolicy, Tool, ToolContext, tool
from actors.workflow import Registry, StepContext, Workflow, WorkflowDefinitionError
from protocol.clock import Clock, FakeClock, SystemClock
from protocol.errors import (
    ErrorCode,
    IllegalTransition,
    InvalidMessage,
    NotFound,
    RatchetError,
    RequestConflict,
    UnknownWorkflow,
)
from protocol.messages import Event, TaskSnapshot
from protocol.states import TaskEvent, TaskStatus, transition
from supervisors.node import Node, NodeConfig

__all__ = [
    "END",
    "CANCEL",
    "FAIL",
    "JoinPolicy",
    "ActionFailed",
    "Accepted",
    "Compensation",
    "RetryPolicy",
    "Tool",
    "ToolContext",
    "tool",
    "Client",
    "RemoteError",
    "Registry",
    "StepContext",
    "Workflow",
    "WorkflowDefinitionError",
    "Clock",
    "FakeClock",
    "SystemClock",
    "ErrorCode",
    "IllegalTransition",
    "InvalidMessage",
    "NotFound",
    "RatchetError",
    "RequestConflict",
    "UnknownWorkflow",
    "Event",
    "TaskSnapshot",
    "TaskEvent",
    "TaskStatus",
    "transition",
    "Node",
    "NodeConfig",
]
