"""An agent turn's model call: what the ledger records of it, the call as a read tool, and
the node's tools as the model sees them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ratchet.actors.agents.models import Model, ModelRequest, ToolSpec
from ratchet.actors.task.agent_conversation import digest
from ratchet.actors.task.kernel import TaskKernel
from ratchet.actors.workflow.nodes import AgentNode
from ratchet.actors.workflow.tools import RetryPolicy, Tool, ToolContext
from ratchet.persistence.ledger import ActionWrite
from ratchet.protocol.codec import canonical, encode
from ratchet.protocol.ids import request_hash

__all__ = ["ModelAnswer", "ModelCall", "ledger_row", "model_tool", "resolve_model",
           "tool_specs"]


class ModelCall(BaseModel):
    """What the ledger records of a model call: the turn's key, and a digest of the exact
    request (the conversation is in the agent log, not copied into every call)."""

    key: str
    conversation: str  # running hash of every message sent
    messages: int
    tools: str
    params: dict[str, Any]
    model: str


class ModelAnswer(BaseModel):
    message: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    model: str
    version: str
    cost: float


def model_tool(node: AgentNode, model: Model, request: ModelRequest) -> Tool[Any, Any]:
    """This turn's model call as a read (retried by the action runner's policy: Retry-After,
    backoff, every retry an event). It is recorded in the ledger by the turn's own commit,
    with the messages it produced: a turn is asked again only if that commit never
    happened."""

    async def ask(ctx: ToolContext, args: ModelCall) -> ModelAnswer:
        response = await model.complete(request)
        return ModelAnswer(message=response.message.to_dict(),
                           prompt_tokens=response.usage.prompt_tokens,
                           completion_tokens=response.usage.completion_tokens,
                           model=response.model or model.name, version=model.version,
                           cost=response.cost)

    return Tool(f"model.{node.name}", ask, "read", ModelCall, ModelAnswer,
                timeout=node.model_timeout,
                retry=RetryPolicy(max_attempts=4, base_delay=0.2, max_delay=10),
                session="model")


def ledger_row(call: ModelCall, answer: ModelAnswer, node: AgentNode, step: int) -> ActionWrite:
    """The ledger row of a model call: request digest, model version, parameters, answer."""
    return ActionWrite(call.key, "SUCCEEDED", insert=True, tool=f"model.{node.name}",
                       kind="model", request_hash=request_hash(canonical(call.model_dump())),
                       args=encode(call.model_dump()), step_index=step, attempts=1,
                       result=answer.model_dump(), provider_id=answer.version)


_SPECS: dict[int, tuple[list[ToolSpec], str]] = {}


def tool_specs(node: AgentNode) -> tuple[list[ToolSpec], str]:
    """The tools as the model sees them, and their digest (schemas are costly to build)."""
    cached = _SPECS.get(id(node))
    if cached is None:
        specs = [ToolSpec(t.name, (t.fn.__doc__ or t.name).strip().split("\n")[0],
                          t.args.model_json_schema()) for t in node.tools]
        cached = (specs, digest([(x.name, x.parameters) for x in specs]))
        _SPECS[id(node)] = cached
    return cached


def resolve_model(actor: TaskKernel, model: Any) -> Model:
    """A node's model: the object, or the registry resource it names."""
    resolved: Model = model if not isinstance(model, str) else \
        actor.deps.registry.resources[model]
    return resolved
