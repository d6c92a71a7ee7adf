"""The registry of workflows and tools a node serves.

Workflows are graphs (:mod:`actors.workflow.graph`, node kinds in :mod:`actors.workflow.nodes`). A step is
``async def step(ctx) -> dict | None``: it reads ``ctx.input`` and ``ctx.state`` and either
mutates ``ctx.state`` or returns a map merged into it. After each node the runtime commits
a checkpoint of what changed and an event; a restarted task continues at the first node not
committed. The task's output is ``state["output"]`` when the workflow ends.

Steps may run more than once if the node dies between the step's end and its commit
(at-least-once per step); side effects that must happen once belong in tools with an
idempotency key (``ctx.call``), which the ledger makes effective once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from ratchet.actors.workflow.definition import Definition
from ratchet.actors.workflow.graph import Workflow
from ratchet.actors.workflow.nodes import StepContext, StepFn
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.errors import UnknownWorkflow, WorkflowDefinitionError

__all__ = ["StepContext", "StepFn", "Workflow", "Registry", "bind_step_logger"]


class Registry:
    """The workflows and tools a node serves (what ``ratchet serve --app module:object``
    loads), and the resources tool code may use (clients, URLs), by name."""

    def __init__(self, workflows: Iterable[Workflow] = (), *, tools: Iterable[Tool[Any, Any]] = (),
                 resources: Mapping[str, Any] | None = None) -> None:
        self._by_name: dict[str, dict[int, Workflow]] = {}
        self._definitions: dict[tuple[str, int], Definition] = {}  # read at registration
        self._tools: dict[str, Tool[Any, Any]] = {}
        self.resources: dict[str, Any] = dict(resources or {})
        for wf in workflows:
            self.register(wf)
        for t in tools:
            self.register_tool(t)
        for t in self._tools.values():
            if t.compensate is not None and t.compensate.tool.name not in self._tools:
                raise WorkflowDefinitionError(
                    f"tool {t.name}: its compensation {t.compensate.tool.name!r} is not registered")

    def register_tool(self, t: Tool[Any, Any]) -> Tool[Any, Any]:
        if t.name in self._tools and self._tools[t.name] is not t:
            raise WorkflowDefinitionError(f"two different tools are named {t.name!r}")
        self._tools[t.name] = t
        return t

    def tool(self, name: str) -> Tool[Any, Any]:
        """The registered tool of that name. Raises UnknownWorkflow (INVALID_ARGUMENT)."""
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownWorkflow(f"no tool named {name!r} is registered", tool=name) from None

    def register(self, workflow: Workflow) -> Workflow:
        workflow.validate()
        for node in workflow.nodes.values():  # an agent's tools must be known for sagas
            for t in getattr(node, "tools", ()):
                self.register_tool(t)
        versions = self._by_name.setdefault(workflow.name, {})
        if workflow.version in versions:
            raise WorkflowDefinitionError(
                f"workflow {workflow.name} v{workflow.version} is registered twice"
            )
        versions[workflow.version] = workflow
        self._definitions[(workflow.name, workflow.version)] = Definition(workflow)
        return workflow

    def definition_hash(self, name: str, version: int) -> str | None:
        """The registered definition's hash (actors/workflow/definition.py)."""
        definition = self._definitions.get((name, version))
        return definition.hash() if definition is not None else None

    def get(self, name: str, version: int | None = None) -> Workflow:
        """The workflow of that name (latest version when ``version`` is None).

        Raises:
            UnknownWorkflow: not registered here.
        """
        versions = self._by_name.get(name)
        if not versions:
            raise UnknownWorkflow(f"no workflow named {name!r}", workflow=name,
                                  known=sorted(self._by_name))
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise UnknownWorkflow(f"workflow {name!r} has no version {version}",
                                  workflow=name, versions=sorted(versions))
        return versions[version]

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def versions(self, name: str) -> list[int]:
        """The registered versions of workflow ``name``, oldest first (none: [])."""
        return sorted(self._by_name.get(name, {}))

    @classmethod
    def coerce(cls, obj: Any) -> Registry:
        """Accept a Registry, a Workflow, or an iterable of Workflows."""
        if isinstance(obj, Registry):
            return obj
        if isinstance(obj, Workflow):
            return cls([obj])
        if isinstance(obj, Iterable):
            return cls(list(obj))
        raise TypeError(f"expected a Registry, Workflow or list of Workflows, got {type(obj)}")


def bind_step_logger(task_id: str, tenant: str, step: str) -> Any:
    return structlog.get_logger("ratchet.step").bind(task_id=task_id, tenant=tenant, step=step)
