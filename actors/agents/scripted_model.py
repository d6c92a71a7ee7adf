"""A deterministic model for demos and tests: replays a script.

The script is a list of replies indexed by the turn (the number of assistant messages
already in the conversation), or a function of the request. Because the reply depends only
on the conversation, a task resumed in another process gets the same answers — and since
recorded turns are never asked again, ``calls`` counts what was really asked.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

from ratchet.actors.agents.models import Message, ModelRequest, ModelResponse, ToolCall, Usage

__all__ = ["ScriptedModel", "reply"]

Reply = dict[str, Any]


def reply(content: str | None = None, *, tool_calls: Sequence[tuple[str, dict[str, Any]]] = (),
          tokens: tuple[int, int] = (10, 5), cost: float = 0.0) -> Reply:
    """A scripted reply: text, or tool calls ``[(name, arguments), ...]``."""
    return {"content": content, "tool_calls": list(tool_calls), "tokens": tokens, "cost": cost}


class ScriptedModel:
    def __init__(self, script: Sequence[Reply] | Callable[[ModelRequest], Reply],
                 name: str = "scripted", version: str = "1", call_log: str | None = None) -> None:
        self.script = script
        self.name = name
        self.version = version
        self.calls = 0
        self.call_log = call_log  # a file to count calls across processes (tests)
        self._ids = itertools.count(1)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        turn = sum(1 for m in request.messages if m.role == "assistant")
        if self.call_log or os.environ.get("RATCHET_TEST_MODEL_LOG"):
            # One short line per call, so tests can count calls across processes.
            with open(self.call_log or os.environ["RATCHET_TEST_MODEL_LOG"], "a") as fh:  # noqa: ASYNC230
                fh.write(f"{turn}\n")
        if callable(self.script):
            r = self.script(request)
        else:
            r = self.script[min(turn, len(self.script) - 1)]
        calls = tuple(ToolCall(f"call_{turn}_{i}", name, dict(args))
                      for i, (name, args) in enumerate(r.get("tool_calls") or ()))
        prompt_tokens, completion_tokens = r.get("tokens", (10, 5))
        cap = request.params.get("max_tokens")
        if cap is not None:  # as a real model does: the answer stops at the cap
            completion_tokens = min(completion_tokens, int(cap))
        return ModelResponse(
            message=Message("assistant", r.get("content"), calls),
            usage=Usage(prompt_tokens, completion_tokens), model=f"{self.name}-{self.version}",
            response_id=f"resp_{next(self._ids)}", cost=float(r.get("cost", 0.0)))
