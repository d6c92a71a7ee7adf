"""Sequential workflows of async Python steps, and the registry a node serves.

A step is ``async def step(ctx) -> dict | None``: it reads ``ctx.input`` and ``ctx.state``
and either mutates ``ctx.state`` or returns a map merged into it. After each step the
runtime commits a checkpoint of what changed and a ``step.completed`` event; a restarted
task continues at the first step not committed. The task's output is ``state["output"]``
when the last step leaves one there.

Steps may run more than once if the node dies between the step's end and its commit
(at-least-once per step); side effects that must happen once belong in tools with an
idempotency key (see the side-effects issue), not in bare steps.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from actors.tools import Tool
from protocol.clock import Clock
from protocol.errors import UnknownWorkflow

__all__ = ["Step", "StepContext", "StepFn", "Workflow", "Registry", "WorkflowDefinitionError"]

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class WorkflowDefinitionError(ValueError):
    """A workflow definition is malformed; the message names the bad part."""


@dataclass(slots=True)
class StepContext:
    task_id: str
    tenant: str
    workflow: str
    step_name: str
    step_index: int
    attempt: int
    input: Mapping[str, Any]
    state: dict[str, Any]
    clock: Clock
    log: Any  # a structlog BoundLogger with task_id and step bound
    runner: Any = None  # the task's ActionRunner (set by the task actor)

    async def call(self, tool: Tool[Any, Any], args: Any) -> Any:
        """Call a registered tool under the action protocol and return its result model.

        Writes take effect once (ledger + idempotency key); a completed call is never made
        again when the step re-runs, its recorded result is returned instead.
        """
        return await self.runner.call(tool, args)


StepFn = Callable[[StepContext], Awaitable[Mapping[str, Any] | None]]


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    fn: StepFn
    timeout: float | None = None  # per run of the step; nests inside the task deadline


class Workflow:
    """A named, versioned sequence of steps.

    >>> wf = Workflow("greet", version=1)
    >>> @wf.step
    ... async def hello(ctx):
    ...     return {"greeting": f"hello {ctx.input['name']}"}
    """

    def __init__(self, name: str, version: int = 1, description: str = "") -> None:
        if not _NAME.match(name):
            raise WorkflowDefinitionError(f"workflow name {name!r} must match {_NAME.pattern}")
        if not isinstance(version, int) or version < 1:
            raise WorkflowDefinitionError(f"workflow {name}: version must be an int >= 1")
        self.name = name
        self.version = version
        self.description = description
        self.steps: list[Step] = []
        self._step_names: set[str] = set()

    def step(self, fn: StepFn | None = None, *, name: str | None = None,
             timeout: float | None = None) -> Any:
        """Decorator appending a step; usable bare or as ``@wf.step(name=..., timeout=...)``."""

        def add(f: StepFn) -> StepFn:
            self.add_step(name or f.__name__, f, timeout=timeout)
            return f

        return add(fn) if fn is not None else add

    def add_step(self, name: str, fn: StepFn, *, timeout: float | None = None) -> None:
        if not _NAME.match(name):
            raise WorkflowDefinitionError(f"workflow {self.name}: step name {name!r} is invalid")
        if name in self._step_names:
            raise WorkflowDefinitionError(f"workflow {self.name}: duplicate step {name!r}")
        if not inspect.iscoroutinefunction(fn):
            raise WorkflowDefinitionError(
                f"workflow {self.name}: step {name!r} must be an async function"
            )
        if timeout is not None and timeout <= 0:
            raise WorkflowDefinitionError(f"workflow {self.name}: step {name!r} timeout must be > 0")
        self.steps.append(Step(name, fn, timeout))
        self._step_names.add(name)

    def validate(self) -> None:
        if not self.steps:
            raise WorkflowDefinitionError(f"workflow {self.name}: has no steps")


class Registry:
    """The workflows and tools a node serves (what ``ratchet serve --app module:object``
    loads), and the resources tool code may use (clients, URLs), by name."""

    def __init__(self, workflows: Iterable[Workflow] = (), *, tools: Iterable[Tool[Any, Any]] = (),
                 resources: Mapping[str, Any] | None = None) -> None:
        self._by_name: dict[str, dict[int, Workflow]] = {}
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

    def has_tool(self, t: Tool[Any, Any]) -> bool:
        return self._tools.get(t.name) is t

    def register(self, workflow: Workflow) -> Workflow:
        workflow.validate()
        versions = self._by_name.setdefault(workflow.name, {})
        if workflow.version in versions:
            raise WorkflowDefinitionError(
                f"workflow {workflow.name} v{workflow.version} is registered twice"
            )
        versions[workflow.version] = workflow
        return workflow

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
