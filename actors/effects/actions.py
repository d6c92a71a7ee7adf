"""The action protocol: every external write takes effect once, or ends UNKNOWN and is
reconciled — never silently retried.

For a write: look the key up in the ledger (a completed action is never called again; the
same key with another request is a typed conflict) → record IN_FLIGHT (commit) → call
through a tool worker (tool_calls.py) → record the outcome (commit). Outcomes are four:
completed → SUCCEEDED; failed (never-retried class, or retries exhausted) → FAILED;
accepted (202) → the task waits (WAITING_EXTERNAL) for a confirmation; unknown (timeout,
dropped connection) → UNKNOWN, then reconcile with ``query``: found → SUCCEEDED with the
result back-filled; not found → resend with the same key; undecidable or no ``query`` →
the task goes UNKNOWN with a handoff package for a human.
Every retry is recorded as an event (reason, delay, attempt) before its delay, with the
action PENDING and its ``next_attempt_at`` stored: a retry delay survives a restart (a
resumed task waits out the rest of it, then records IN_FLIGHT again before the call).

A ``SecretStr`` field of a tool's argument or result model is a secret: the ledger keeps it
sealed (the store's ``Sealer``) and opens it for a resumed call or a compensation; the
request hash is of the sealed form; a handoff package shows it redacted.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ratchet.actors.core.backoff import backoff_delay
from ratchet.actors.effects.action_reports import (
    coerce_args,
    coerce_result,
    error_of,
    failed_before,
    handoff_package,
    retry_payload,
)
from ratchet.actors.effects.breakers import circuit_open_failure, through_breaker
from ratchet.actors.effects.local_tools import no_remote_tools
from ratchet.actors.effects.risk import gate
from ratchet.actors.effects.signals import (
    AwaitExternal,
    HandoffRequired,
    PauseRequested,
    TaskSuspended,
)
from ratchet.actors.effects.switches import Switches
from ratchet.actors.effects.tool_calls import Invoke, RemoteAsk, SessionOf
from ratchet.actors.workflow.tools import Accepted, Decision, Tool, classify
from ratchet.persistence.ledger import ActionRecord, ActionWrite, action_record
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import (
    ActionFailed,
    ActionKeyTaken,
    RatchetError,
    ToolCircuitOpen,
    ToolDeadlineExceeded,
    ToolRateLimited,
)
from ratchet.protocol.ids import request_hash
from ratchet.protocol.redaction import dump_model, has_secrets, secret_values
from ratchet.protocol.tracing import in_call_span

__all__ = ["ActionRunner", "PauseRequested", "AwaitExternal", "CallEnv", "HandoffRequired",
           "TaskSuspended"]

Commit = Callable[..., Awaitable[None]]


@dataclass
class CallEnv:
    """What the runner needs from its task actor."""

    task_id: str
    tenant: str
    step_index: int
    store: TaskStore
    clock: Clock
    commit: Commit  # commit(**TaskChange fields) under the actor's version
    session: SessionOf  # the task's tool session by name (the local worker runs in it)
    deadline: float | None  # absolute (clock.now()), the nearer of task and step deadlines
    rng: random.Random
    default_external_timeout: float = 3600.0
    #: Count each new write against the task's ``tool_calls`` budget (refused atomically
    #: when spent). Off for agent turns (they count their own) and for compensations (an
    #: undo must never be refused for want of budget).
    count_tool_calls: bool = True
    switches: Switches | None = None  # disabled tools are refused
    pause_requested: Callable[[], bool] | None = None  # checked before every call
    #: Told the clear values of a call's secret arguments before the call, so that the
    #: task cuts them out of what it shows (an error message may quote them).
    note_secrets: Callable[[set[str]], None] | None = None
    #: What the task has spent so far (tokens, money, tool calls): told in retry events.
    spent: Callable[[], dict[str, float]] | None = None
    #: Every tool call's way to its worker: the node's ``ToolCalls`` (tool_calls.py).
    remote_ask: RemoteAsk = no_remote_tools


class ActionRunner:
    def __init__(self, env: CallEnv) -> None:
        self.env = env

    # -- entry point ------------------------------------------------------------------

    async def call(self, tool: Tool[Any, Any], args: Any, *, compensates: str | None = None) -> Any:
        """Run ``tool`` with ``args`` under the action protocol; returns its result model.

        Raises:
            ActionFailed: failed for good. HandoffRequired / AwaitExternal: task suspends.
        """
        args = self._checked(tool, args, compensates)
        if self.env.switches is not None and compensates is None:
            self.env.switches.refuse_if_disabled(self.env.tenant, tool.name)
        key = tool.key(args) if tool.key is not None else None
        await gate(self.env, tool, args, key, compensates)  # risk tiers: actors/effects/risk.py
        # A new call to a provider whose circuit breaker is open fails at once, before
        # anything is recorded (CIRCUIT_OPEN, retryable: for the step to route on); an action
        # already under way (its ledger row exists) retries, waiting for the probe instead.
        refusal = self._refusal(tool) if compensates is None else None
        if refusal is not None and (key is None or await self.env.store.get_action(
                self.env.tenant, key) is None):
            raise circuit_open_failure(tool.name, refusal)
        if tool.kind == "read":
            return await self._read(tool, args)
        assert key is not None
        return await self._write(tool, args, key, compensates)

    def _refusal(self, tool: Tool[Any, Any]) -> ToolCircuitOpen | None:
        if tool.breaker is None or self.env.switches is None:
            return None
        return self.env.switches.breakers.check(self.env.tenant, tool.provider,
                                                self.env.clock.monotonic(), tool.timeout)

    # -- reads: retried freely, not ledgered --------------------------------------------

    async def _read(self, tool: Tool[Any, Any], args: BaseModel) -> Any:
        attempt = 1
        while True:
            ok, value = await self._invoke(tool, args, None, attempt, "call")
            if ok:
                return coerce_result(tool, value)
            decision = classify(value, "read")
            delay = self._delay(decision, value, attempt, tool)
            if decision is Decision.FAIL or delay is None:
                failure = ActionFailed(f"{tool.name} failed: {value}", tool=tool.name,
                                       error=error_of(value))
                failure.exhausted = decision is not Decision.FAIL
                if isinstance(value, RatchetError):
                    failure.code = value.code  # the provider's reason (CIRCUIT_OPEN: routable)
                raise failure
            await self.env.commit(events=[(EventType.ACTION_RETRY, self._retry_payload(
                tool, args, None, decision, value, delay, attempt))])
            await self.env.clock.sleep(delay)
            attempt += 1

    # -- writes: the ledger -----------------------------------------------------------

    async def _write(self, tool: Tool[Any, Any], args: BaseModel, key: str,
                     compensates: str | None) -> Any:
        data = dump_model(args)
        sealer = self.env.store.secrets
        digest = self._digest(tool, args)
        # No read first: the insert is the check. A key already in the ledger makes the
        # whole change roll back and comes back with its row (one round trip, not two).
        try:
            await self.env.commit(
                action=ActionWrite(key, "IN_FLIGHT", insert=True, tool=tool.name,
                                   kind=tool.kind, request_hash=digest,
                                   args=sealer.pack(data),
                                   step_index=self.env.step_index, attempts=1,
                                   compensates=compensates),
                events=[(EventType.ACTION_STARTED, {"key": key, "tool": tool.name, "attempt": 1,
                                                    "compensates": compensates})],
                **({"spend": {"tool_calls": 1}, "enforce_budget": True}
                   if self.env.count_tool_calls and compensates is None else {}),
            )
        except ActionKeyTaken as taken:
            assert taken.existing is not None
            return await self._resume(tool, args, key, digest, action_record(
                taken.existing, sealer.unpack_optional))
        return await self._attempts(tool, args, key, 1)

    async def _resume(self, tool: Tool[Any, Any], args: BaseModel, key: str, digest: str,
                      row: ActionRecord) -> Any:
        if row.request_hash != digest:
            raise ActionFailed(f"idempotency key {key} was used for a different request",
                               key=key, tool=tool.name)
        if row.status == "COMPENSATED":
            # Done and undone: reusing its result would report a side effect that no longer
            # exists. Doing it again is a new business action, with a new key.
            raise ActionFailed(f"action {key} was compensated; it is not redone under the"
                               " same key", key=key, tool=tool.name)
        if row.status == "SUCCEEDED":
            await self.env.commit(events=[(EventType.ACTION_REUSED, {"key": key, "tool": tool.name,
                                                                     "status": row.status})])
            return coerce_result(tool, row.result)
        if row.status == "FAILED":
            raise failed_before(tool.name, key, row.error)
        if row.accepted:
            raise AwaitExternal(key, key, self.env.default_external_timeout)
        if row.status == "PENDING":
            # A retry was scheduled and nothing is in flight: honour its delay (it is stored,
            # so it survives a restart), then call again with the same key.
            if row.next_attempt_at is not None:
                await self.env.clock.sleep(max(0.0, row.next_attempt_at - self.env.clock.now()))
            await self._start_attempt(tool, key, row.attempts, resumed=True)
            return await self._attempts(tool, args, key, row.attempts)
        # IN_FLIGHT (we crashed during the call) or UNKNOWN: the outcome is not known.
        return await self._reconcile(tool, args, key, row.attempts)

    async def _attempts(self, tool: Tool[Any, Any], args: BaseModel, key: str, attempt: int) -> Any:
        while True:
            ok, value = await self._invoke(tool, args, key, attempt, "call")
            if ok:
                return await self._record_success(tool, key, value, EventType.ACTION_SUCCEEDED)
            decision = classify(value, "write")
            if decision is Decision.UNKNOWN:
                await self.env.commit(
                    action=ActionWrite(key, "UNKNOWN", error=error_of(value)),
                    events=[(EventType.ACTION_UNKNOWN, {"key": key, "tool": tool.name,
                                                        "attempt": attempt,
                                                        "error": error_of(value)})])
                return await self._reconcile(tool, args, key, attempt)
            delay = self._delay(decision, value, attempt, tool)
            if decision is Decision.FAIL or delay is None:
                await self._record_failure(tool, key, value, attempt, decision)
            assert delay is not None
            await self.env.commit(
                action=ActionWrite(key, "PENDING", attempts=attempt + 1,
                                   next_attempt_at=self.env.clock.now() + delay),
                events=[(EventType.ACTION_RETRY, self._retry_payload(tool, args, key, decision,
                                                                     value, delay, attempt))])
            await self.env.clock.sleep(delay)
            attempt += 1
            await self._start_attempt(tool, key, attempt)

    async def _start_attempt(self, tool: Tool[Any, Any], key: str, attempt: int,
                             resumed: bool = False) -> None:
        """PENDING → IN_FLIGHT, committed before the call."""
        await self.env.commit(
            action=ActionWrite(key, "IN_FLIGHT"),
            events=[(EventType.ACTION_STARTED, {"key": key, "tool": tool.name, "attempt": attempt,
                                                **({"resumed": True} if resumed else {})})])

    async def _reconcile(self, tool: Tool[Any, Any], args: BaseModel, key: str, attempt: int) -> Any:
        if tool.query is None:
            raise HandoffRequired("outcome unknown and the tool has no query",
                                  handoff_package(tool.name, args, key, attempt, "no query declared"))
        for q in range(1, tool.retry.max_attempts + 1):
            ok, value = await self._invoke(tool, args, key, q, "query")
            if ok:
                if value is None:
                    if attempt >= tool.retry.max_attempts:
                        raise HandoffRequired("not found after the last allowed resend",
                                              handoff_package(tool.name, args, key, attempt,
                                                            "resend budget exhausted"))
                    await self.env.commit(
                        action=ActionWrite(key, "IN_FLIGHT", attempts=attempt + 1),
                        events=[(EventType.ACTION_RECONCILED, {"key": key, "found": False,
                                                               "then": "resend with the same key",
                                                               "attempt": attempt + 1})])
                    return await self._attempts(tool, args, key, attempt + 1)
                return await self._record_success(tool, key, value, EventType.ACTION_RECONCILED)
            decision = classify(value, "read")
            delay = self._delay(decision, value, q, tool)
            if decision is Decision.FAIL or delay is None:
                break
            await self.env.commit(events=[(EventType.ACTION_RETRY, self._retry_payload(
                tool, args, key, decision, value, delay, q, op="query"))])
            await self.env.clock.sleep(delay)
        raise HandoffRequired("outcome could not be reconciled",
                              handoff_package(tool.name, args, key, attempt, "query undecidable"))

    # -- helpers ------------------------------------------------------------------------

    async def _record_success(self, tool: Tool[Any, Any], key: str, value: Any, event: str) -> Any:
        if isinstance(value, Accepted):
            correlation = value.correlation_id or key
            await self.env.commit(
                action=ActionWrite(key, "IN_FLIGHT", accepted=True, provider_id=value.provider_id),
                events=[(EventType.ACTION_ACCEPTED, {"key": key, "tool": tool.name,
                                                     "provider_id": value.provider_id,
                                                     "correlation_id": correlation})])
            raise AwaitExternal(correlation, key, value.timeout or self.env.default_external_timeout)
        try:
            result = coerce_result(tool, value)
        except ActionFailed as exc:
            # The provider acted but answered outside the contract: we cannot know what it
            # did. That is an unknown outcome for a human, not a failure to retry.
            await self.env.commit(
                action=ActionWrite(key, "UNKNOWN", error=error_of(exc)),
                events=[(EventType.ACTION_UNKNOWN, {"key": key, "tool": tool.name,
                                                    "error": error_of(exc)})])
            raise HandoffRequired("the provider's result failed validation", {
                "why": "invalid provider result", "tool": tool.name, "key": key,
                "error": exc.message}) from exc
        provider_id = getattr(result, "provider_id", None)
        payload: dict[str, Any] = {"key": key, "tool": tool.name, "provider_id": provider_id}
        if event == EventType.ACTION_RECONCILED:
            payload["found"] = True
        await self.env.commit(
            action=ActionWrite(key, "SUCCEEDED", result=self._kept(result),
                               provider_id=provider_id),
            events=[(event, payload)])
        return result

    async def _record_failure(self, tool: Tool[Any, Any], key: str, exc: BaseException,
                              attempt: int, decision: Decision) -> None:
        exhausted = decision is not Decision.FAIL  # kept on the row: a re-run knows it too
        reason = "retries or deadline exhausted" if exhausted else "not retryable"
        await self.env.commit(
            action=ActionWrite(key, "FAILED", error={**error_of(exc), "exhausted": exhausted}),
            events=[(EventType.ACTION_FAILED, {"key": key, "tool": tool.name, "attempt": attempt,
                                               "reason": reason, "error": error_of(exc)})])
        failure = ActionFailed(f"{tool.name} failed ({reason}): {exc}", key=key, tool=tool.name,
                               error=error_of(exc))
        failure.exhausted = exhausted
        if isinstance(exc, RatchetError):
            failure.code = exc.code  # a 403 stays PERMISSION_DENIED on the wire
        raise failure

    def _checked(self, tool: Tool[Any, Any], args: Any, compensates: str | None) -> Any:
        """``args`` as the tool's model, its secrets noted; a pause taken here (a safe
        point: nothing of this call has started)."""
        args = coerce_args(tool, args)
        if self.env.note_secrets is not None and has_secrets(tool.args):
            self.env.note_secrets(secret_values(dump_model(args)))
        if self.env.pause_requested is not None and self.env.pause_requested() \
                and compensates is None:
            raise PauseRequested(tool.name)
        return args

    def _kept(self, result: BaseModel) -> Any:
        """A result as the ledger keeps it: plain data with its secrets sealed (pydantic's
        JSON dump would mask them, and a reused result must give them back)."""
        data = dump_model(result)
        return self.env.store.secrets.seal_leaves(data) if has_secrets(type(result)) else data

    def _remaining(self) -> float | None:
        return None if self.env.deadline is None else self.env.deadline - self.env.clock.due_now()

    def _delay(self, decision: Decision, exc: BaseException, attempt: int,
               tool: Tool[Any, Any]) -> float | None:
        """The delay before the next attempt, or None when no attempt is left in budget."""
        if decision is Decision.FAIL or attempt >= tool.retry.max_attempts:
            return None
        if decision is Decision.RETRY_AFTER and isinstance(exc, (ToolRateLimited, ToolCircuitOpen)) \
                and exc.retry_after is not None:
            delay = max(0.0, exc.retry_after)
        else:
            delay = backoff_delay(attempt - 1, tool.retry.base_delay, tool.retry.max_delay,
                                  self.env.rng)
        remaining = self._remaining()
        if remaining is not None and delay >= remaining:
            return None  # the deadline would pass before the next attempt
        return delay

    async def query_once(self, tool: Tool[Any, Any], args: BaseModel, key: str) -> tuple[bool, Any]:
        """One ``query`` of the provider (no retries): ``(ok, result | Accepted | None | error)``."""
        if tool.query is None:
            return (False, ActionFailed(f"{tool.name} has no query", tool=tool.name))
        return await self._invoke(tool, args, key, 1, "query")

    async def _invoke(self, tool: Tool[Any, Any], args: BaseModel, key: str | None,
                      attempt: int, op: str) -> tuple[bool, Any]:
        timeout = tool.timeout
        remaining = self._remaining()
        if remaining is not None:
            if remaining <= 0:
                return (False, ToolDeadlineExceeded(f"deadline passed before {tool.name}",
                                                    tool=tool.name))
            timeout = min(timeout, remaining)
        if tool.breaker is None or self.env.switches is None or op != "call":
            return await self._ask(tool, args, key, attempt, timeout, op)
        return await through_breaker(
            self.env.switches.breakers, self.env.tenant, tool, self.env.clock.monotonic,
            lambda: self._ask(tool, args, key, attempt, timeout, op))

    async def _ask(self, tool: Tool[Any, Any], args: BaseModel, key: str | None, attempt: int,
                   timeout: float, op: str) -> tuple[bool, Any]:
        # One path for every tool: a request to a worker (tool_calls.py), the node's own.
        asked = self.env.remote_ask(self.env.task_id, self.env.tenant, Invoke(
            tool, args, key, attempt, timeout, op), self.env.session)
        return await in_call_span(  # its span, if tracing (protocol/tracing.py)
            asked, self.env.task_id, self.env.tenant, self.env.step_index, tool.name,
            tool.session, key, attempt, op, args)

    def _retry_payload(self, tool: Tool[Any, Any], args: BaseModel, key: str | None,
                       decision: Decision, exc: BaseException, delay: float, attempt: int,
                       op: str = "call") -> dict[str, Any]:
        return retry_payload(tool.name, key, op, decision, exc, delay, attempt,
                             self._digest(tool, args), self.env.spent() if self.env.spent else None)

    def _digest(self, tool: Tool[Any, Any], args: BaseModel) -> str:
        """The request's hash, of its sealed form (as the ledger's ``request_hash``)."""
        return request_hash(self.env.store.secrets.canonical({"tool": tool.name,
                                                              "args": dump_model(args)}))
