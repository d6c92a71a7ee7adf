"""The model interface: what an agent node asks, and what it gets back.

A model proposes (an answer, or tool calls); the runtime disposes. Failures are reported
with the ``protocol.errors.Tool*`` classes so that model calls share the retry policy of
tools: 429 → ToolRateLimited (Retry-After honoured), 5xx / connection refused / malformed
replies → ToolTransient, 400 → ToolInvalidArgument, 401/403 → ToolPermissionDenied.
A model call has no side effect, so a timeout is transient too (ToolTransient).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["Message", "Model", "ModelRequest", "ModelResponse", "Prices", "ToolCall", "ToolSpec",
           "Usage"]

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Message:
    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # on role "tool": the call this answers
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        return cls(role=data["role"], content=data.get("content"),
                   tool_calls=tuple(ToolCall(c["id"], c["name"], dict(c["arguments"]))
                                    for c in data.get("tool_calls") or ()),
                   tool_call_id=data.get("tool_call_id"), name=data.get("name"))


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)  # temperature, max_tokens, ...


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Prices:
    """A model's prices per 1,000 tokens, in the deployment's currency. A model that has
    them (``model.prices``) lets a money budget be reserved before each call
    (actors/task/agent_budget.py)."""

    prompt_per_1k: float
    completion_per_1k: float

    def cost(self, usage: Usage) -> float:
        return (usage.prompt_tokens * self.prompt_per_1k
                + usage.completion_tokens * self.completion_per_1k) / 1000


@dataclass(frozen=True)
class ModelResponse:
    """The assistant's message (text and/or tool calls), usage, and what produced it."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    response_id: str | None = None
    cost: float = 0.0  # in the deployment's currency, if the adapter knows prices


class Model(Protocol):
    """Implemented by the scripted model (tests, demos) and the HTTP adapter.

    Optional, read when present (actors/task/agent_budget.py): ``prices`` (:class:`Prices`),
    ``max_output_tokens`` (int) and ``count_tokens(request) -> int`` (the prompt's exact
    count): they make the reservation of a call against the task's budget tight.
    """

    name: str
    version: str

    async def complete(self, request: ModelRequest) -> ModelResponse: ...
