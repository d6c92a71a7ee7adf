"""The asyncio actor core: an actor is one asyncio task draining a mailbox.

Hooks (all run in the actor's own task):

- ``on_start()`` — before the first message; load state from the Store here. A raise
  is a crash: the actor exits with that reason and its supervisor decides.
- ``receive(message)`` — one message at a time; the return value answers an ``ask``.
  A raise is a crash (the asker gets :class:`ActorCrashed`), so a supervisor restarts the
  actor from its last checkpoint rather than letting it run on with half-applied state.
- ``on_stop()`` — after the last message, on a normal stop or a crash; a raise is logged.

Addresses are names (``task:<id>``); :class:`ActorSystem` maps names to live refs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

from ratchet.protocol.clock import Clock, SystemClock
from ratchet.protocol.errors import ActorCrashed, ActorStopped, AskTimeout, RatchetError
from ratchet.protocol.ids import new_id

__all__ = [
    "Actor",
    "ActorRef",
    "ActorSystem",
    "ExitCallback",
    "PeriodicService",
    "ServiceActor",
]

log = structlog.get_logger("ratchet.actors")

A = TypeVar("A", bound="Actor")
ExitCallback = Callable[["ActorRef[Any]", BaseException | None], None]


@dataclass(slots=True)
class _Letter:
    message: Any
    correlation_id: str
    reply: asyncio.Future[Any] | None


_WAKE = _Letter(None, "", None)


class Actor:
    """Base class; subclasses override the hooks. ``self.ref`` is set before ``on_start``."""

    ref: ActorRef[Any]

    async def on_start(self) -> None:
        """Runs in the actor's task before any message. Raise = crash."""

    async def receive(self, message: Any) -> Any:
        """Handle one message. Raise = crash; the return value answers an ask."""
        raise NotImplementedError(f"{type(self).__name__} cannot handle {type(message).__name__}")

    async def on_stop(self) -> None:
        """Runs in the actor's task after the last message, normal stop or crash."""

    # Out-of-band requests, called from outside the actor's task (through its ref), for
    # work that must not wait behind the mail in progress. Both default to "not supported".

    def interrupt(self) -> bool:
        """Abandon the work in progress, if any; True if something was interrupted."""
        return False

    def request_pause(self) -> None:
        """Pause at the next safe point, which may come before the current mail is done."""

    #: Whether the actor supervises children (and answers ``WhichChildren``).
    supervises = False


class ActorRef(Generic[A]):
    """The only handle other code holds on an actor: send it mail, ask it, stop it."""

    def __init__(self, name: str, actor: A, system: ActorSystem, on_exit: ExitCallback | None):
        self.name = name
        #: The actor, until its task ended (see :meth:`_let_go`).
        self._actor: A | None = actor
        self._supervises = actor.supervises
        self._system = system
        self._on_exit = on_exit
        self._mailbox: asyncio.Queue[_Letter] = asyncio.Queue()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self.exit_reason: BaseException | None = None

    def __repr__(self) -> str:
        return f"<ActorRef {self.name}>"

    @property
    def is_alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def tell(self, message: Any, correlation_id: str | None = None) -> None:
        """Queue ``message``; never blocks. Mail to a stopped actor is dropped (logged)."""
        if not self.is_alive or self._stopping:
            log.debug("mail to stopped actor dropped", actor=self.name)
            return
        self._mailbox.put_nowait(_Letter(message, correlation_id or new_id("cor"), None))

    async def ask(self, message: Any, timeout: float, correlation_id: str | None = None) -> Any:
        """Send ``message`` and wait for the answer.

        Raises:
            AskTimeout: no answer within ``timeout`` seconds.
            ActorCrashed: the actor raised while handling it.
            ActorStopped: the actor stopped (or was stopped) before answering.
        """
        cid = correlation_id or new_id("cor")
        fut = self.ask_nowait(message, cid)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise AskTimeout(
                f"no answer from {self.name} within {timeout}s", actor=self.name, correlation_id=cid
            ) from None

    def ask_nowait(self, message: Any, correlation_id: str | None = None) -> asyncio.Future[Any]:
        """Send ``message``; the future of its answer, for a caller that bounds the wait
        itself (or only adds a callback). It fails as :meth:`ask` does.

        Raises:
            ActorStopped: the actor is not running (nothing was sent).
        """
        cid = correlation_id or new_id("cor")
        if not self.is_alive or self._stopping:
            raise ActorStopped("actor is not running", actor=self.name, correlation_id=cid)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._mailbox.put_nowait(_Letter(message, cid, fut))
        return fut

    def interrupt(self) -> bool:
        """Out of band, in the caller's task: ask the actor to abandon the work in progress
        (its ``interrupt()`` hook, if it has one, cancels only that work). True if it did."""
        actor = self._actor
        return actor.interrupt() if actor is not None and self.is_alive else False

    def request_pause(self) -> None:
        """Out of band: ask the actor to pause at its next safe point (if it can)."""
        if self._actor is not None and self.is_alive:
            self._actor.request_pause()

    @property
    def supervises(self) -> bool:
        return self._supervises

    def stop(self) -> None:
        """Stop after the message being handled (a safe point); later mail is refused."""
        if self._stopping:
            return
        self._stopping = True
        if self.is_alive:
            self._mailbox.put_nowait(_WAKE)

    def kill(self) -> None:
        """Cancel the actor where it is (its ``on_stop`` still runs)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

    async def wait_stopped(self, timeout: float | None = None) -> None:
        if self._task is not None:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def stop_and_wait(self, timeout: float) -> None:
        """Stop at a safe point; past ``timeout``, kill. Idempotent."""
        self.stop()
        try:
            await self.wait_stopped(timeout)
        except TimeoutError:
            self.kill()
            with contextlib.suppress(Exception):  # its crash is its exit reason, not ours
                await _unless_we_are_cancelled(self.wait_stopped(timeout))

    # -- the actor's own task ----------------------------------------------------------

    def _start(self) -> None:
        assert self._actor is not None
        self._actor.ref = self
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"actor:{self.name}")

    async def _run(self) -> None:
        reason: BaseException | None = None
        actor = self._actor
        assert actor is not None
        try:
            await actor.on_start()
            while not self._stopping:
                letter = await self._mailbox.get()
                if letter is _WAKE:
                    continue
                try:
                    result = await actor.receive(letter.message)
                except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:  # a control signal nobody handled is a crash too
                    if letter.reply is not None and not letter.reply.done():
                        crash = ActorCrashed(f"{self.name} crashed: {exc!r}", actor=self.name,
                                             correlation_id=letter.correlation_id)
                        crash.__cause__ = exc
                        letter.reply.set_exception(crash)
                    raise
                if letter.reply is not None and not letter.reply.done():
                    letter.reply.set_result(result)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit) as exc:
            reason = exc
            raise
        except BaseException as exc:
            reason = exc
            if getattr(exc, "ends_actor", False):
                log.info("actor ended", actor=self.name, reason=repr(exc))
            else:
                log.warning("actor crashed", actor=self.name, error=repr(exc))
        finally:
            self._stopping = True
            try:
                await actor.on_stop()
            except asyncio.CancelledError:
                # Killed while stopping (past its shutdown timeout): this is the end of the
                # actor's own task either way; what matters now is to leave the directory.
                log.warning("on_stop cancelled", actor=self.name)
            except Exception as exc:  # a failing on_stop must not hide the exit reason
                log.error("on_stop raised", actor=self.name, error=repr(exc))
            self._fail_pending()
            self.exit_reason = reason
            self._system._unregister(self)
            on_exit = self._let_go()
            if on_exit is not None:
                on_exit(self, reason)

    def _let_go(self) -> ExitCallback | None:
        """Its task ended: drop the actor and the exit callback (returned, to call once).

        The actor and its ref point at each other (``actor.ref``), and the callback (a
        bound method of the supervisor) leads back to this ref: kept, they made every
        stopped actor — a finished task's whole object graph — garbage for the cyclic
        collector's next full pass, which a busy node reaches seldom (W2's 200 tasks at
        once peaked ~2.5 MB higher; docs/operations.md, "Memory"). Dropped, reference
        counting frees them once nobody holds the ref. What the ref still answers for a
        stopped actor does not need it: ``interrupt`` and ``request_pause`` do nothing,
        ``supervises`` was read at the start."""
        on_exit, self._on_exit, self._actor = self._on_exit, None, None
        return on_exit

    def _fail_pending(self) -> None:
        while not self._mailbox.empty():
            letter = self._mailbox.get_nowait()
            if letter.reply is not None and not letter.reply.done():
                letter.reply.set_exception(ActorStopped("actor stopped", actor=self.name))


class ActorSystem:
    """Spawns actors and keeps the directory of live ones by name."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._directory: dict[str, ActorRef[Any]] = {}

    def spawn(self, actor: A, name: str, on_exit: ExitCallback | None = None) -> ActorRef[A]:
        """Start ``actor`` under ``name``; the name must not be live already."""
        existing = self._directory.get(name)
        if existing is not None and existing.is_alive:
            raise RatchetError(f"actor {name} is already running", actor=name)
        ref: ActorRef[A] = ActorRef(name, actor, self, on_exit)
        self._directory[name] = ref
        ref._start()
        return ref

    def lookup(self, name: str) -> ActorRef[Any] | None:
        ref = self._directory.get(name)
        return ref if ref is not None and ref.is_alive else None

    def _unregister(self, ref: ActorRef[Any]) -> None:
        if self._directory.get(ref.name) is ref:
            del self._directory[ref.name]

    def live(self) -> list[str]:
        return sorted(n for n, r in self._directory.items() if r.is_alive)

    def live_refs(self, prefix: str, suffix: str = "") -> list[ActorRef[Any]]:
        """The live actors whose name starts with ``prefix`` (and ends with ``suffix``):
        e.g. the task actors of a node."""
        return [r for n, r in self._directory.items()
                if n.startswith(prefix) and n.endswith(suffix) and r.is_alive]


# Mail, not an error class: it carries the serve loop's exception into the mailbox, whose
# handler re-raises it so the actor crashes on its own task.
@dataclass(slots=True)
class _ServiceFailed:
    error: BaseException


class ServiceActor(Actor):
    """An actor whose work is a long-running loop (``serve``), e.g. a NATS consumer.

    The loop runs as a task owned by the actor; if it raises, the actor crashes with that
    error so its supervisor restarts it. ``on_stop`` cancels the loop.
    """

    _serve_task: asyncio.Task[None] | None = None

    async def serve(self) -> None:
        raise NotImplementedError

    async def on_start(self) -> None:
        self._serve_task = asyncio.get_running_loop().create_task(self.serve())
        self._serve_task.add_done_callback(self._serve_done)

    def _serve_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.ref.tell(_ServiceFailed(task.exception()))  # type: ignore[arg-type]

    async def receive(self, message: Any) -> Any:
        if isinstance(message, _ServiceFailed):
            raise message.error
        return await self.handle(message)

    async def handle(self, message: Any) -> Any:
        return await super().receive(message)

    async def on_stop(self) -> None:
        if self._serve_task is not None:
            await _cancel_until_done(self._serve_task, self.ref.name)


class PeriodicService(ServiceActor):
    """A service that runs :meth:`sweep` every ``interval`` seconds of its clock."""

    clock: Clock
    interval: float

    async def serve(self) -> None:
        while True:
            await self.clock.sleep(self.interval)
            await self.sweep()

    async def sweep(self) -> int:
        raise NotImplementedError


async def _unless_we_are_cancelled(work: Awaitable[Any]) -> None:
    """Await work that was cancelled (or killed): its CancelledError is expected and
    swallowed, but a cancellation of the task awaiting it is never swallowed."""
    try:
        await work
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def _cancel_until_done(task: asyncio.Task[None], name: str, patience: float = 10.0) -> None:
    """Cancel ``task`` and wait for it, cancelling again while it goes on: on Python 3.11
    ``asyncio.wait_for`` (inside nats-py's ``fetch``) can lose a cancellation that arrives
    as its inner future completes, and a loop that lost it would run on, orphaned, and hold
    NATS's drain at shutdown. Our own cancellation propagates (``asyncio.wait`` raises it)."""
    deadline = asyncio.get_running_loop().time() + patience
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
        if asyncio.get_running_loop().time() >= deadline:
            log.error("service loop ignores cancellation", actor=name)
            return
    if not task.cancelled() and task.exception() is not None:
        log.debug("service loop ended with an error at stop", actor=name,
                  error=repr(task.exception()))
