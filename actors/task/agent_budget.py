"""A model call's worst case, reserved against the task's budget before the call.

Checking the budget only at the start of a turn lets one call overshoot it: a model asked
with 10 tokens left may answer with 4,000. So before each model call the turn computes
the call's worst case and admits the call only if it fits what the task has left:

- **prompt**: the model's own count (``model.count_tokens(request)``, when it has one: e.g.
  a tokenizer), else an upper bound that needs no tokenizer: the UTF-8 bytes of every
  message, tool call and tool schema, plus a few tokens per message for the chat format
  (a token is at least one byte). Safe, and about four times the real count for English;
  a model with ``count_tokens`` gets tight reservations.
- **output**: capped so that the worst case fits: ``max_tokens`` sent with the request is
  the smallest of the node's ``params["max_tokens"]``, the model's ``max_output_tokens``,
  what the token budget has left after the prompt, and what the money budget buys at the
  model's ``prices`` (:class:`~actors.agents.models.Prices`).
- Not even one output token affordable: the call is not made; the node ends as budget
  exhausted (its ``on_budget_exhausted`` route), with the dimension.

The reservation is atomic because the task actor is the only spender of its tokens and
money (turns are sequential; branches run no agent nodes), and the actual usage is
committed with the turn. A model that answers past the ``max_tokens`` it was sent (an
adapter that ignores it) is logged as an overrun; the usage recorded is still the actual.
A money budget with a model that declares no ``prices`` cannot be bounded before the call:
it is checked at the start of each turn only (docs/agents.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ratchet.actors.agents.models import Model, ModelRequest, Prices

__all__ = ["Reservation", "prompt_bound", "reserve"]

#: Tokens a chat format adds per message (role markers, separators), generously.
PER_MESSAGE = 8
PER_REQUEST = 16


@dataclass(frozen=True, slots=True)
class Reservation:
    tokens: int  # the call's worst case: prompt bound + max output tokens
    money: float | None  # its worst-case cost (None: the model declares no prices)
    max_tokens: int | None  # the output cap to send (None: no cap needed or known)

    def overrun(self, tokens: int, money: float) -> dict[str, Any] | None:
        """What the actual usage exceeded, if anything (the adapter ignored the cap)."""
        over: dict[str, Any] = {}
        if self.max_tokens is not None and tokens > self.tokens:
            over["tokens"] = tokens - self.tokens
        if self.money is not None and money > self.money + 1e-12:
            over["money"] = money - self.money
        return over or None


def prompt_bound(model: Model, request: ModelRequest) -> int:
    """An upper bound of the request's prompt tokens (the model's own count if it has one)."""
    counter = getattr(model, "count_tokens", None)
    if callable(counter):
        return int(counter(request))
    size = PER_REQUEST
    for m in request.messages:
        size += PER_MESSAGE + len((m.content or "").encode())
        for call in m.tool_calls:
            size += len(call.name.encode()) + len(json.dumps(call.arguments).encode())
    for spec in request.tools:
        size += len(spec.name.encode()) + len(spec.description.encode()) + \
            len(json.dumps(spec.parameters).encode())
    return size


def reserve(budget: Mapping[str, float], spent: Mapping[str, float], model: Model,
            request: ModelRequest) -> Reservation | str | None:
    """The call's reservation; the budget dimension it cannot fit; or None when the task
    has no token or money budget to protect (nothing to compute)."""
    tokens_left = _left(budget, spent, "tokens")
    prices: Prices | None = getattr(model, "prices", None)
    money_left = _left(budget, spent, "money")
    if tokens_left is None and (money_left is None or prices is None):
        return None
    prompt = prompt_bound(model, request)
    caps = [c for c in (request.params.get("max_tokens"),
                        getattr(model, "max_output_tokens", None)) if c is not None]
    if tokens_left is not None:
        room = math.floor(tokens_left) - prompt
        if room < 1:
            return "tokens"
        caps.append(room)
    if money_left is not None and prices is not None:
        afford = _output_affordable(money_left, prompt, prices)
        if afford < 1:
            return "money"
        caps.append(afford)
    finite = [c for c in caps if c != math.inf]
    cap = int(min(finite)) if finite else None
    money = None if prices is None or cap is None else \
        (prompt * prices.prompt_per_1k + cap * prices.completion_per_1k) / 1000
    return Reservation(prompt + (cap or 0), money, cap)


def _left(budget: Mapping[str, float], spent: Mapping[str, float], dim: str) -> float | None:
    limit = budget.get(dim)
    return None if limit is None else limit - spent.get(dim, 0)


def _output_affordable(money_left: float, prompt: int, prices: Prices) -> float:
    room = money_left - prompt * prices.prompt_per_1k / 1000
    if room < 0:
        return 0
    if prices.completion_per_1k <= 0:
        return math.inf
    return math.floor(room * 1000 / prices.completion_per_1k)
