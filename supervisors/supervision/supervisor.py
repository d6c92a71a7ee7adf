"""Supervisors: actors that start, watch and restart other actors (Erlang/OTP style).

A supervisor starts its static children in order in ``on_start``. When a child exits,
the exit arrives as a message; :mod:`supervisors.supervision.restart_policy` decides: restart (after a
jittered backoff read from the injected clock) or not; if restarts within the period pass
the intensity, the supervisor stops every child and crashes with :class:`Escalation`, so
its own parent decides next. ``on_escalate`` runs first (a task supervisor uses it to end
its task in FAILED instead of crashing the node). Children stop in reverse start order.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ratchet.actors.core.actor import Actor, ActorRef, ActorSystem
from ratchet.protocol.errors import Escalation
from ratchet.supervisors.supervision.restart_policy import (
    Restart,
    Strategy,
    backoff_delay,
    intensity_exceeded,
    should_restart,
)

__all__ = ["ChildSpec", "Supervisor", "RestartChild", "StartChild",
           "StartChildren", "StopChild", "StopChildren", "WhichChildren"]

log = structlog.get_logger("ratchet.supervisor")


@dataclass(frozen=True)
class ChildSpec:
    """How to start one child. ``factory(restart_count)`` builds a fresh actor each time:
    a restarted actor is rebuilt from its checkpoint, never reused."""

    id: str
    factory: Callable[[int], Actor]
    restart: Restart = Restart.PERMANENT
    shutdown_timeout: float = 5.0
    #: With ``auto_shutdown``, the supervisor stops once a significant child is gone for good.
    significant: bool = False

    def __post_init__(self) -> None:
        if not self.id or not callable(self.factory):
            raise ValueError(f"child spec {self.id!r}: needs an id and a callable factory")
        if self.shutdown_timeout <= 0:
            raise ValueError(f"child spec {self.id!r}: shutdown_timeout must be > 0")


@dataclass(slots=True)
class StartChild:
    spec: ChildSpec


@dataclass(slots=True)
class StartChildren:
    """Start several children in one message (a fan-out's branches); answers their refs."""

    specs: list[ChildSpec]


@dataclass(slots=True)
class StopChild:
    id: str


@dataclass(slots=True)
class StopChildren:
    """Stop several children; ids that are not running are skipped."""

    ids: list[str]


@dataclass(slots=True)
class WhichChildren:
    pass


@dataclass(slots=True)
class RestartChild:
    """An operator's restart of one child: stop it, start a fresh one (counted as a
    restart, within the supervisor's intensity)."""

    id: str


@dataclass(slots=True)
class _ChildExited:
    id: str
    ref: ActorRef[Any]
    reason: BaseException | None


@dataclass(slots=True)
class _RestartChild:
    id: str


@dataclass
class _Child:
    spec: ChildSpec
    ref: ActorRef[Any] | None = None
    restarts: int = 0
    restart_times: list[float] = field(default_factory=list)


class Supervisor(Actor):
    """Args:
        system: where children are spawned.
        name: this supervisor's name in logs (children are spawned as
            ``<spawned name>/<child id>``).
        children: static children, started in order.
        strategy: only ``one_for_one`` is implemented so far.
        max_restarts, period: intensity (OTP defaults: 1 in 5 s; ours: 3 in 60 s).
        backoff_base, backoff_cap: restart delay bounds, seconds.
        on_escalate: awaited with the cause before escalating.
    """

    supervises = True

    def __init__(
        self,
        system: ActorSystem,
        name: str,
        children: list[ChildSpec] | None = None,
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        max_restarts: int = 3,
        period: float = 60.0,
        backoff_base: float = 0.05,
        backoff_cap: float = 5.0,
        on_escalate: Callable[[BaseException | None], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if strategy is not Strategy.ONE_FOR_ONE:
            raise NotImplementedError(f"strategy {strategy} is not implemented yet")
        ids = [c.id for c in children or []]
        if len(ids) != len(set(ids)):
            raise ValueError(f"supervisor {name}: duplicate child ids {ids}")
        self.system = system
        self.name = name
        self._initial = list(children or [])
        self._children: dict[str, _Child] = {}
        self._max_restarts = max_restarts
        self._period = period
        self._backoff = (backoff_base, backoff_cap)
        self._on_escalate = on_escalate
        self._rng = rng or random.Random()
        self._timers: set[asyncio.Task[None]] = set()
        self._stopping = False
        #: Stop this supervisor when a significant child (or the last child) has exited for
        #: good (OTP's auto_shutdown).
        self.auto_shutdown = False

    # -- hooks -------------------------------------------------------------------------

    async def on_start(self) -> None:
        for spec in self._initial:
            self._start_child(spec)

    async def receive(self, message: Any) -> Any:
        if isinstance(message, _ChildExited):
            await self._child_exited(message)
        elif isinstance(message, _RestartChild):
            child = self._children.get(message.id)
            if child is not None and child.ref is None and not self._stopping:
                self._spawn(child)
        elif isinstance(message, StartChild):
            return self._start_child(message.spec)
        elif isinstance(message, StartChildren):
            return [self._start_child(spec) for spec in message.specs]
        elif isinstance(message, (StopChild, StopChildren)):
            ids = [message.id] if isinstance(message, StopChild) else message.ids
            refs = []
            for cid in ids:
                child = self._children.pop(cid, None)
                if child is not None and child.ref is not None:
                    child.ref.stop()  # all of them at once, then wait for each
                    refs.append((child.ref, child.spec.shutdown_timeout))
            for ref, timeout in refs:
                await ref.stop_and_wait(timeout)
        elif isinstance(message, RestartChild):
            child = self._children.get(message.id)
            if child is None:
                return {"restarted": False, "reason": f"no child {message.id}"}
            old, child.ref = child.ref, None  # its exit is then ignored: not a crash
            if old is not None:
                await old.stop_and_wait(child.spec.shutdown_timeout)
            child.restarts += 1
            child.restart_times.append(self.system.clock.monotonic())
            self._spawn(child)
            return {"restarted": True, "restarts": child.restarts}
        elif isinstance(message, WhichChildren):
            return [
                {"id": c.spec.id, "alive": bool(c.ref and c.ref.is_alive), "restarts": c.restarts,
                 "restart": c.spec.restart.value}
                for c in self._children.values()
            ]
        else:
            return await super().receive(message)
        return None

    async def on_stop(self) -> None:
        self._stopping = True
        for timer in self._timers:
            timer.cancel()
        await self._stop_children()

    # -- internals ---------------------------------------------------------------------

    def _start_child(self, spec: ChildSpec) -> ActorRef[Any]:
        existing = self._children.get(spec.id)
        if existing is not None and existing.ref is not None:
            # Idempotent: two activations racing for one child get the same actor (raising
            # here would crash this supervisor and every sibling with it).
            return existing.ref
        if existing is not None:
            return self._spawn(existing)  # between restarts: start it now
        child = _Child(spec)
        self._children[spec.id] = child
        return self._spawn(child)

    def _spawn(self, child: _Child) -> ActorRef[Any]:
        cid = child.spec.id

        def on_exit(ref: ActorRef[Any], reason: BaseException | None) -> None:
            self.ref.tell(_ChildExited(cid, ref, reason))

        actor = child.spec.factory(child.restarts)
        child.ref = self.system.spawn(actor, f"{self.ref.name}/{cid}", on_exit)
        return child.ref

    async def _child_exited(self, msg: _ChildExited) -> None:
        child = self._children.get(msg.id)
        if child is None or child.ref is not msg.ref:
            return  # stopped on purpose, or an exit we already handled
        child.ref = None
        abnormal = msg.reason is not None and not isinstance(msg.reason, asyncio.CancelledError) \
            and not getattr(msg.reason, "ends_actor", False)
        if self._stopping or not should_restart(child.spec.restart, abnormal):
            del self._children[msg.id]
            if self.auto_shutdown and (child.spec.significant or not self._children):
                self.ref.stop()
            return
        now = self.system.clock.monotonic()
        child.restart_times = [t for t in child.restart_times if now - t < self._period]
        child.restart_times.append(now)
        if intensity_exceeded(child.restart_times, now, self._max_restarts, self._period):
            log.error("restart intensity exceeded; escalating", supervisor=self.name,
                      child=msg.id, error=repr(msg.reason))
            if self._on_escalate is not None:
                await self._on_escalate(msg.reason)
            raise Escalation(
                f"{self.name}: child {msg.id} restarted more than {self._max_restarts}"
                f" times in {self._period}s", actor=self.name, child=msg.id,
                cause=repr(msg.reason),
            )
        delay = backoff_delay(child.restarts, *self._backoff, rng=self._rng)
        child.restarts += 1
        log.info("restarting child", supervisor=self.name, child=msg.id,
                 restarts=child.restarts, delay_s=round(delay, 4), error=repr(msg.reason))
        timer = asyncio.get_running_loop().create_task(self._restart_later(msg.id, delay))
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

    async def _restart_later(self, child_id: str, delay: float) -> None:
        await self.system.clock.sleep(delay)
        self.ref.tell(_RestartChild(child_id))

    async def _stop_children(self) -> None:
        for child in reversed(list(self._children.values())):
            ref = child.ref
            child.ref = None
            if ref is not None:
                await ref.stop_and_wait(child.spec.shutdown_timeout)
        self._children.clear()
