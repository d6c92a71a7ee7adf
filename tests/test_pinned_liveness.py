"""A call pinned to a tool worker that is dead (issue 19, item 4): the node asks NATS
whether the worker still listens before it sends (actors/effects/remote_tool.py). Gone: the
request is not sent, the call fails at once with ``ToolWorkerGone`` (retryable: the retry
goes to any worker, which takes the session from its stored state), never UNKNOWN. A worker
that dies after taking the request is the usual unknown outcome, reconciled by query.
Real worker processes, SIGKILLed; the finance simulator counts the effects."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ratchet
from ratchet.testing import FinanceClient
from tests.conftest import NodeFactory
from tests.test_remote_tools import WorkerProcess
from tests.tool_apps import PayArgs, pay_pinned

APP = "tests.tool_apps:pinned_tools"
#: The step's two gates (the ``release`` fixture makes them).
gates: dict[str, asyncio.Event] = {}

pay_two = ratchet.Workflow("pinned.pay_two", version=1)


@pay_two.step
async def pay_twice(ctx: ratchet.StepContext) -> dict[str, Any]:
    """The first payment pins the session to its worker; the second waits for the test."""
    await ctx.call(pay_pinned, PayArgs(invoice=f"{ctx.input['run']}-1", amount=1.0))
    gates["first_paid"].set()
    await gates["release"].wait()
    started = time.monotonic()
    paid = await ctx.call(pay_pinned, PayArgs(invoice=f"{ctx.input['run']}-2", amount=2.0))
    return {"output": {"provider_id": paid.provider_id, "took": time.monotonic() - started}}


app = ratchet.Registry([pay_two], tools=[pay_pinned])


@pytest.fixture
def workers() -> Iterator[Callable[..., WorkerProcess]]:
    procs: list[WorkerProcess] = []

    def factory(nats_url: str, env: dict[str, str], worker_id: str) -> WorkerProcess:
        p = WorkerProcess(nats_url, env, 20.0, APP, "--worker-id", worker_id)
        procs.append(p)
        return p

    yield factory
    for p in procs:
        p.stop()


@pytest.fixture
def release() -> asyncio.Event:
    """The step's gates, afresh (an asyncio.Event is bound to the loop it is first waited
    on, and each test has its own loop); the one the test opens."""
    gates["first_paid"], gates["release"] = asyncio.Event(), asyncio.Event()
    return gates["release"]


async def _pinned_to(holder: WorkerProcess, client: ratchet.Client, run: str) -> Any:
    """A task whose first payment went through ``holder``, which holds its session now;
    its second waits for the test's release. Its handle."""
    await holder.ready()
    handle = await client.submit("pinned.pay_two", {"run": run}, key=run)
    await asyncio.wait_for(gates["first_paid"].wait(), 30)
    return handle


async def _kill(worker: WorkerProcess) -> None:
    worker.proc.send_signal(signal.SIGKILL)
    assert await asyncio.wait_for(asyncio.to_thread(worker.proc.wait), 30) == -signal.SIGKILL


async def _events(client: ratchet.Client, task_id: str) -> list[Any]:
    return [e async for e in client.watch(task_id, idle_timeout=2)]


@pytest.mark.slow
async def test_a_call_pinned_to_a_killed_worker_fails_fast_unsent_and_moves_to_another(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
        simulator: ratchet.testing.FinanceSimulatorProcess,
        workers: Callable[..., WorkerProcess], release: asyncio.Event) -> None:
    await start_node(app)
    env = {"RATCHET_FINANCE_URL": simulator.url}
    holder = workers(nats_url, env, "holder")
    handle = await _pinned_to(holder, client, "gone")
    await _kill(holder)
    await workers(nats_url, env, "other").ready()

    release.set()
    output = await handle.result(timeout=60)

    # Not a timeout's wait: failed at once, retried on the shared subject.
    assert output["took"] < pay_pinned.timeout
    assert finance.effects() == {"invoice:gone-1:pay": 1, "invoice:gone-2:pay": 1}
    second = [e for e in await _events(client, handle.task_id)
              if e.payload.get("key") == "invoice:gone-2:pay"]
    types = [e.type for e in second]
    assert "action.unknown" not in types and types[-1] == "action.succeeded", types
    [retry] = [e for e in second if e.type == "action.retry"]
    assert retry.payload["error"]["type"] == "ToolWorkerGone"


@pytest.mark.slow
async def test_a_pinned_worker_killed_after_taking_the_request_is_reconciled_by_query(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient,
        simulator: ratchet.testing.FinanceSimulatorProcess,
        workers: Callable[..., WorkerProcess], release: asyncio.Event) -> None:
    await start_node(app)
    env = {"RATCHET_FINANCE_URL": simulator.url}
    # It dies by its own SIGKILL right after the provider committed the second payment.
    holder = workers(nats_url, {**env, "RATCHET_TOOL_DIE_AFTER_EFFECT": "taken-2"}, "holder")
    handle = await _pinned_to(holder, client, "taken")
    await workers(nats_url, env, "other").ready()  # to answer the query

    release.set()
    assert await asyncio.wait_for(asyncio.to_thread(holder.proc.wait), 30) == -signal.SIGKILL
    output = await handle.result(timeout=60)

    assert output["provider_id"].startswith("clm")
    assert finance.effects() == {"invoice:taken-1:pay": 1, "invoice:taken-2:pay": 1}
    types = [e.type for e in await _events(client, handle.task_id)
             if e.payload.get("key") == "invoice:taken-2:pay"]
    assert "action.unknown" in types and "action.reconciled" in types, types
