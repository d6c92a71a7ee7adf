"""Context compaction (actors/agents/compaction.py): a long conversation is folded into a
summary by a declared summarizer, the pinned facts are kept verbatim by the runtime, the
full history stays in the store, and a resumed task sends the model the same view."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.actors.agents.compaction import Compaction, cut_point, summary_message, transcript
from ratchet.actors.agents.loop_detect import LoopPolicy
from ratchet.actors.agents.models import Message, ModelRequest, ModelResponse, ToolCall
from ratchet.actors.agents.scripted_model import ScriptedModel, reply
from tests.conftest import NodeFactory, wait_terminal

TURNS = 6  # tool-call turns before the answer


class Booking(BaseModel):
    city: str


class Booked(BaseModel):
    provider_id: str


async def _book(ctx: ratchet.ToolContext, args: Booking) -> Booked:
    """Book a hotel."""
    return Booked(provider_id=f"htl-{args.city}")


book = ratchet.tool(kind="write", args=Booking, result=Booked,
                    key=lambda a: f"book:{a.city}", name="book")(_book)


class Plan(BaseModel):
    cities: list[str]


class Planner(ScriptedModel):
    """Books one city a turn, then answers; remembers every request it was sent and can
    hold a turn (a model still thinking) so the test can stop the node meanwhile."""

    def __init__(self) -> None:
        def script(request: ModelRequest) -> dict[str, Any]:
            n = sum(1 for m in request.messages if m.role == "tool") + self.folded(request)
            if n >= TURNS:
                return reply(json.dumps({"cities": [f"c{i}" for i in range(TURNS)]}))
            return reply("x" * 200, tool_calls=[("book", {"city": f"c{n}"})])

        super().__init__(script, name="planner")
        self.requests: list[list[dict[str, Any]]] = []
        self.hold_after_summary = False  # hold the first request sent with a summary
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    @staticmethod
    def folded(request: ModelRequest) -> int:
        """Tool results folded into a summary (each summary says how many)."""
        return sum(m.content.count("booked ") for m in request.messages
                   if m.role == "user" and m.content and m.content.startswith("Summary"))

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append([m.to_dict() for m in request.messages])
        if self.hold_after_summary and self.folded(request) and not self.held.is_set():
            self.held.set()
            await self.release.wait()
        return await super().complete(request)


class Summarizer(ScriptedModel):
    def __init__(self) -> None:
        super().__init__(lambda r: reply(" ".join(
            f"booked {c}" for c in sorted(set(_cities(r.messages[-1].content or ""))))),
            name="summarizer")


def _cities(text: str) -> list[str]:
    return [w.strip('"{}),') for w in text.split() if w.strip('"{}),').startswith("c")
            and w.strip('"{}),')[1:].isdigit()]


def _app(planner: Planner, summarizer: Summarizer) -> ratchet.Registry:
    wf = ratchet.Workflow("trip")
    wf.agent("planner", model=planner, tools=[book], output=Plan, system="You plan trips.",
             prompt=lambda s, i: "Book a hotel in each city, then list them.",
             max_turns=20, loop=LoopPolicy(repeat=50, alternation=50),
             compact=Compaction(summarizer=summarizer, at_tokens=1200, keep_last=2,
                                pinned=lambda state, inp: ["budget: 100 EUR a night"]),
             next="done")

    @wf.step
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": ctx.state["planner"]}

    return ratchet.Registry([wf], tools=[book])


async def test_a_long_conversation_is_folded_and_the_pinned_facts_are_kept(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    planner, summarizer = Planner(), Summarizer()
    node = await start_node(_app(planner, summarizer))
    task_id = (await client.submit("trip", {}, key="t1")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"cities": [f"c{i}" for i in range(TURNS)]}
    compacted = [e.payload for e in events if e.type == "agent.compacted"]
    assert compacted and compacted[0]["sent"] < compacted[0]["messages"]
    assert compacted[0]["estimate_after"] < compacted[0]["estimate_before"]
    last = planner.requests[-1]
    assert [m["role"] for m in last[:2]] == ["system", "user"]  # the head, verbatim
    assert last[1]["content"] == "Book a hotel in each city, then list them."
    summary = next(m["content"] for m in last if m["content"].startswith("Summary"))
    assert "budget: 100 EUR a night" in summary  # the node's pinned fact
    assert "already done, never to repeat: book (key book:c0, provider id htl-c0)" in summary
    # the full history is still in the store, and the summarizer's call in the ledger
    log = await node.store.agent_log(task_id, "planner#0")
    assert sum(1 for kind, _ in log if kind == "message") > len(last)
    actions = await node.store.task_actions(task_id)
    assert [a.key for a in actions if a.key.endswith(":compact")]
    assert summarizer.calls == len(compacted)


async def test_a_resumed_task_sends_the_same_compacted_view_without_summarizing_again(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    planner, summarizer = Planner(), Summarizer()
    planner.hold_after_summary = True  # the first turn after the compaction is held
    first = await start_node(_app(planner, summarizer), drain_timeout=0.2)
    task_id = (await client.submit("trip", {}, key="t2")).task_id
    await asyncio.wait_for(planner.held.wait(), 10)
    asked_before, calls = planner.requests[-1], summarizer.calls
    await first.stop()  # the held turn is cut at the drain's end: it never commits
    await start_node(_app(planner, summarizer))
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    retried = planner.requests[planner.requests.index(asked_before) + 1]
    assert retried == asked_before  # rebuilt from the log: the same view
    assert summarizer.calls == calls


def test_the_cut_never_separates_a_tool_result_from_its_call() -> None:
    call = Message("assistant", None, (ToolCall("1", "book", {"city": "a"}),))
    msgs = [Message("system", "s"), Message("user", "u"), call, Message("tool", "r", (), "1"),
            call, Message("tool", "r", (), "1"), Message("assistant", "done")]
    assert cut_point(msgs, head=2, keep_last=2) == 4  # not 5: the result needs its call
    assert cut_point(msgs, head=2, keep_last=5) is None  # nothing worth folding
    text = transcript(msgs[2:4])
    assert text == 'assistant: calls book({"city": "a"})\ntool: r'
    folded = summary_message("short", ["id 7"])
    assert folded.content == "Summary of the conversation so far:\nshort\n\nPinned facts (kept verbatim):\n- id 7"
