"""Agent-node figures. Prints one JSON object (last line).

- agent_turn_overhead_p50_us / _p99_us: the runtime's cost of one turn — the model
  proposes a read tool call, the runtime validates it, executes it, records the turn
  (model call ledgered, messages checkpointed, budget spent) — measured between consecutive
  ``agent.turn`` events of one task, minus the scripted model's own time;
- conversation_rss_kb: node memory per live 50-turn conversation (200 tasks held at their
  51st model call; resident set growth / 200);
- budget_overshoot_max: the most any task spent past its token or money budget, over
  ``BUDGET_TURNS`` turns of tasks with random budgets and a model with random usage (it
  honours the ``max_tokens`` it is sent, as real ones do): must be 0 — each call's worst
  case is reserved before it is made (actors/task/agent_budget.py).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import itertools
import random

from pydantic import BaseModel

import ratchet
from bench.steps import percentile
from ratchet.actors.agents.loop_detect import LoopPolicy
from ratchet.actors.agents.models import ModelRequest, ModelResponse, Prices, Usage
from ratchet.actors.agents.scripted_model import ScriptedModel, reply
from ratchet.protocol.events import decode_event
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.credentials import admin_key_path
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

TURNS = 200
LIVE = 200
LIVE_TURNS = 50
BUDGET_TURNS = 1000


class Query(BaseModel):
    key: str


class Found(BaseModel):
    key: str
    value: int


async def _lookup(ctx: ratchet.ToolContext, args: Query) -> Found:
    """Look a key up."""
    return Found(key=args.key, value=len(args.key))


lookup = ratchet.Tool("lookup", _lookup, "read", Query, Found)


class Answer(BaseModel):
    turns: int


class TimedModel(ScriptedModel):
    """The scripted model, timing its own work so it can be subtracted."""

    def __init__(self, turns: int, hold: asyncio.Event | None = None) -> None:
        def script(request: ModelRequest) -> dict[str, Any]:
            n = sum(1 for m in request.messages if m.role == "assistant")
            if n >= turns:
                return reply(json.dumps({"turns": n}))
            return reply(tool_calls=[("lookup", {"key": f"k{n}"})])

        super().__init__(script)
        self.hold = hold
        self.turns = turns
        self.seconds = 0.0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        n = sum(1 for m in request.messages if m.role == "assistant")
        if self.hold is not None and n >= self.turns:
            await self.hold.wait()  # a model that is still thinking: the conversation is live
        started = time.perf_counter()
        try:
            return await super().complete(request)
        finally:
            self.seconds += time.perf_counter() - started


class RandomUsage(ScriptedModel):
    """Calls the lookup tool for ever, each answer of a random length up to the cap."""

    prices = Prices(prompt_per_1k=0.5, completion_per_1k=1.5)

    def __init__(self, seed: int = 7) -> None:
        super().__init__([reply(tool_calls=[("lookup", {"key": "k"})])], name="random")
        self.rng = random.Random(seed)

    def count_tokens(self, request: ModelRequest) -> int:
        return sum(4 + len(m.content or "") // 4 for m in request.messages)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        answer = await super().complete(request)
        cap = int(request.params.get("max_tokens", 800))
        usage = Usage(self.count_tokens(request), min(cap, self.rng.randint(1, 800)))
        return ModelResponse(answer.message, usage, answer.model, answer.response_id,
                             cost=self.prices.cost(usage))


async def budget_overshoot(client: ratchet.Client, node: ratchet.Node,
                           model: RandomUsage) -> float:
    """The most a task spent past its budget, over ``BUDGET_TURNS`` turns."""
    rng, worst, n = random.Random(11), 0.0, 0
    while model.calls < BUDGET_TURNS:
        budgets = [{"tokens": rng.randint(100, 4000)} if rng.random() < 0.5 else
                   {"money": round(rng.uniform(0.1, 3.0), 3)} for _ in range(20)]
        ids = [(await client.submit("budgeted", {}, key=f"b-{n}-{i}", budget=b)).task_id
               for i, b in enumerate(budgets)]
        n += 1
        for task_id, budget in zip(ids, budgets, strict=True):
            async for event in client.watch(task_id, idle_timeout=60):
                if event.type in ("task.succeeded", "task.failed"):
                    break
            spent = (await node.store.load_task(task_id)).spent
            worst = max(worst, *(spent.get(d, 0) - limit for d, limit in budget.items()))
    return max(0.0, worst)


def workflow(name: str, model: Any, **agent: Any) -> ratchet.Workflow:
    wf = ratchet.Workflow(name)
    wf.agent("agent", model=model, tools=[lookup], output=Answer, max_turns=10_000,
             prompt=lambda s, i: "look everything up", loop=LoopPolicy(repeat=1000,
                                                                       alternation=1000),
             **agent)
    if agent.get("on_budget_exhausted"):

        @wf.step
        async def spent(ctx: ratchet.StepContext) -> dict[str, Any]:
            return {"output": {"budget": "spent"}}

    return wf


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def main() -> None:
    configure_logging("warning")
    hold = asyncio.Event()
    fast, live, spender = TimedModel(TURNS), TimedModel(LIVE_TURNS, hold), RandomUsage()
    registry = ratchet.Registry([workflow("fast", fast), workflow("live", live),
                                 workflow("budgeted", spender, on_budget_exhausted="spent")])
    with tempfile.TemporaryDirectory(prefix="ratchet-agent-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        url = await server.start()
        # Every held conversation must be running at once: admission gets that many slots.
        node = ratchet.Node(ratchet.NodeConfig(state_dir=Path(tmp) / "node", nats_url=url,
                                               max_running=LIVE + 8),
                            registry)
        await node.start()
        client = await ratchet.Client.connect(url, "bench",
                                              creds=admin_key_path(node.config.state_dir))
        try:
            task_id = (await client.submit("fast", {}, key="fast")).task_id
            events = [e async for e in client.watch(task_id, idle_timeout=120)]
            assert events[-1].type == "task.succeeded", events[-1]
            stamps = [e.occurred_at for e in events if e.type == "agent.turn"]
            model_per_turn = fast.seconds / max(1, fast.calls)
            overhead = sorted((b - a - model_per_turn) * 1e6
                              for a, b in itertools.pairwise(stamps))

            reached: set[str] = set()
            all_live = asyncio.Event()

            async def on_turn(msg: Any) -> None:
                event = decode_event(msg.data)
                if event.payload.get("turn") == LIVE_TURNS - 1:
                    reached.add(event.task_id)
                    if len(reached) >= LIVE:
                        all_live.set()

            sub = await client.nc.subscribe("ratchet.events.bench.*.agent.turn", cb=on_turn)
            before = rss_kb()
            for i in range(LIVE):
                await client.submit("live", {}, key=f"live-{i}")
            await asyncio.wait_for(all_live.wait(), 600)
            after = rss_kb()
            await sub.unsubscribe()
            hold.set()
            overshoot = await budget_overshoot(client, node, spender)
        finally:
            await client.close()
            await node.stop()
            await server.stop()
    print(json.dumps({
        "agent_turn_overhead_p50_us": round(statistics.median(overhead)),
        "agent_turn_overhead_p99_us": round(percentile(overhead, 0.99)),
        "turns_measured": len(overhead),
        "scripted_model_us_per_turn": round(model_per_turn * 1e6, 1),
        "conversation_rss_kb": round((after - before) / LIVE, 1),
        "live_conversations": LIVE, "turns_per_conversation": LIVE_TURNS,
        "budget_overshoot_max": round(overshoot, 9), "budget_turns": spender.calls,
    }))


if __name__ == "__main__":
    asyncio.run(main())
