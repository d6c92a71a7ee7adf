"""Ratchet's public API: what workflow authors and clients import.

    import ratchet

    expense = ratchet.Workflow("expense.submit", version=1)

    @expense.step
    async def validate(ctx: ratchet.StepContext):
        return {"amount": ctx.input["amount"]}

    app = ratchet.Registry([expense])      # ratchet serve --app mymodule:app

    client = await ratchet.Client.connect(url, "acme", creds="ann.nk")
    handle = await client.submit("expense.submit", {"amount": 12}, key="r-1")
    output = await handle.result(timeout=60)   # or raises TaskFailed, TaskCancelled, ...

Secrets: type a field of a workflow's ``input_model`` or of a tool's argument or result
model as ``ratchet.SecretStr`` (pydantic's) and its value is sealed at rest and shown as
``ratchet.REDACTED`` everywhere else (docs/security-secrets.md).

The layers below are importable as ``ratchet.protocol``, ``ratchet.persistence``,
``ratchet.actors`` and ``ratchet.supervisors``; test components (a fake clock, the
finance and model simulators, the demo) as ``ratchet.testing``.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import SecretStr

    from ratchet.actors.effects.risk_policy import ToolRisk
    from ratchet.actors.effects.tool_worker import ToolWorker
    from ratchet.actors.transport.client import Client
    from ratchet.actors.transport.handles import TaskHandle, TaskOutcome
    from ratchet.actors.workflow.node_loops import NodeLoops
    from ratchet.actors.workflow.nodes import CANCEL, END, FAIL, JoinPolicy
    from ratchet.actors.workflow.reconcile import Reconcile, RecordedEffect
    from ratchet.actors.workflow.registry import Registry, StepContext, Workflow
    from ratchet.actors.workflow.remote_tools import remote_tool, served_by
    from ratchet.actors.workflow.revalidate import RevalidateContext
    from ratchet.actors.workflow.tools import (
        Accepted,
        BreakerPolicy,
        Compensation,
        RetryPolicy,
        Tool,
        ToolContext,
        tool,
    )
    from ratchet.protocol.clock import Clock, FakeClock, SystemClock
    from ratchet.protocol.errors import (
        ActionFailed,
        ErrorCode,
        IllegalTransition,
        InvalidMessage,
        NatsUnreachable,
        NotFound,
        RatchetError,
        RemoteError,
        RequestConflict,
        SandboxBlocked,
        SecretUnreadable,
        UnknownWorkflow,
        WorkflowDefinitionError,
    )
    from ratchet.protocol.messages import Event, TaskSnapshot
    from ratchet.protocol.redaction import REDACTED, redact_log_event
    from ratchet.protocol.states import TaskEvent, TaskStatus, transition
    from ratchet.protocol.task_outcomes import (
        ResultTimeout,
        TaskBudgetExhausted,
        TaskCancelled,
        TaskError,
        TaskFailed,
        TaskHandedOff,
    )
    from ratchet.supervisors.node.node import Node, NodeConfig

__version__ = "0.2.0"

#: Public name → the module that defines it, imported at the first use of one of its
#: names (PEP 562): ``import ratchet`` stays cheap, and ``ratchet serve`` loads only what
#: it serves (docs/operations.md, "Restart (W4)").
_WHERE: dict[str, str] = {name: module for module, names in {
    "pydantic": ("SecretStr",),
    "ratchet.actors.effects.risk_policy": ("ToolRisk",),
    "ratchet.actors.effects.tool_worker": ("ToolWorker",),
    "ratchet.actors.transport.client": ("Client",),
    "ratchet.actors.transport.handles": ("TaskHandle", "TaskOutcome"),
    "ratchet.actors.workflow.node_loops": ("NodeLoops",),
    "ratchet.actors.workflow.nodes": ("CANCEL", "END", "FAIL", "JoinPolicy"),
    "ratchet.actors.workflow.reconcile": ("Reconcile", "RecordedEffect"),
    "ratchet.actors.workflow.registry": ("Registry", "StepContext", "Workflow"),
    "ratchet.actors.workflow.remote_tools": ("remote_tool", "served_by"),
    "ratchet.actors.workflow.revalidate": ("RevalidateContext",),
    "ratchet.actors.workflow.tools": (
        "Accepted", "BreakerPolicy", "Compensation", "RetryPolicy", "Tool", "ToolContext", "tool",
    ),
    "ratchet.protocol.clock": ("Clock", "FakeClock", "SystemClock"),
    "ratchet.protocol.errors": (
        "ActionFailed", "ErrorCode", "IllegalTransition", "InvalidMessage", "NatsUnreachable",
        "NotFound", "RatchetError", "RemoteError", "RequestConflict", "SandboxBlocked",
        "SecretUnreadable", "UnknownWorkflow", "WorkflowDefinitionError",
    ),
    "ratchet.protocol.messages": ("Event", "TaskSnapshot"),
    "ratchet.protocol.redaction": ("REDACTED", "redact_log_event"),
    "ratchet.protocol.states": ("TaskEvent", "TaskStatus", "transition"),
    "ratchet.protocol.task_outcomes": (
        "ResultTimeout", "TaskBudgetExhausted", "TaskCancelled", "TaskError", "TaskFailed",
        "TaskHandedOff",
    ),
    "ratchet.supervisors.node.node": ("Node", "NodeConfig"),
}.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ratchet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "__version__",
    "END",
    "CANCEL",
    "FAIL",
    "JoinPolicy",
    "NodeLoops",
    "Reconcile",
    "RecordedEffect",
    "ActionFailed",
    "SandboxBlocked",
    "Accepted",
    "BreakerPolicy",
    "Compensation",
    "RetryPolicy",
    "Tool",
    "ToolContext",
    "ToolRisk",
    "tool",
    "remote_tool",
    "served_by",
    "ToolWorker",
    "Client",
    "TaskHandle",
    "TaskOutcome",
    "TaskError",
    "TaskFailed",
    "TaskBudgetExhausted",
    "TaskCancelled",
    "TaskHandedOff",
    "ResultTimeout",
    "NatsUnreachable",
    "RemoteError",
    "Registry",
    "StepContext",
    "RevalidateContext",
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
    "REDACTED",
    "SecretStr",
    "SecretUnreadable",
    "redact_log_event",
]
