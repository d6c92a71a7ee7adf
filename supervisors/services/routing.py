"""What the JetStream routers (actor mail, confirmations, decisions) share: delivering a
message to its task's actor, and settling a message that could not be delivered.

A message is acked only once its effect is committed (the actor answered). Failures:
mail for a finished task is acked and dropped; a retryable error is NAK'ed with a delay
that doubles per delivery; anything else that names a real problem with the message is
dead-lettered with its error and acked; an unexpected error is NAK'ed for a retry, and
dead-lettered with the exception at its :data:`GIVE_UP_AFTER`-th delivery — one bad message
never stops a router, nor comes back for ever.

A router does not wait for a whole batch before it fetches the next: each message is
delivered in its own task, and the next fetch waits only for room (fewer than ``batch``
deliveries in progress). Why: an actor answers its mail between steps, so mail for a task
whose step runs long (a tool call waiting out its timeout; or the start mail of a task whose
first Advance got ahead of it in its mailbox) is answered only when the step ends. Waiting
for the batch made every other task of the partition wait with it — a task's start held
back for a neighbour's 30-second tool call (issue 19's "lost first delivery", which was
this).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog
from nats.aio.msg import Msg

from ratchet.actors.core.actor import ServiceActor
from ratchet.actors.task.actor import DeliverMail
from ratchet.actors.transport.bus import Bus, deliveries, redelivery_delay
from ratchet.persistence.ports import TaskRecord, TaskStore
from ratchet.protocol import tracing
from ratchet.protocol.auth import Principal
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.clock import Clock
from ratchet.protocol.codec import decode_envelope
from ratchet.protocol.errors import (
    ActorCrashed,
    HandlingFailed,
    InvalidMessage,
    RatchetError,
    TaskFinished,
    Unauthenticated,
)
from ratchet.protocol.mail_seal import MailSeal
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import tenant_of
from ratchet.supervisors.services.authn import Authenticator
from ratchet.supervisors.supervision.tasks import TaskSupervision

__all__ = ["TaskRouter", "Target", "deliver", "deliveries", "settle_failure", "given_up",
           "POISON_AFTER", "GIVE_UP_AFTER"]

#: Deliveries that crashed the receiving actor before a message counts as poison.
POISON_AFTER = 2
#: Deliveries that raised an unexpected (non-Ratchet) exception before a message is
#: dead-lettered with it (the NAK delays before: 0.5 + 1 + 2 + 4 s). Intake uses it too.
GIVE_UP_AFTER = 5


@dataclass(frozen=True, slots=True)
class Target:
    """Where a message goes: the task, the envelope to hand it (possibly annotated), and
    the task's row if the router has just loaded it."""

    task_id: str
    envelope: Envelope
    record: TaskRecord | None = None


class TaskRouter(ServiceActor):
    """A JetStream consumer whose messages go to tasks. Every router runs the same steps —
    decode, find the task (``target``), deliver, ack after the actor answered; a failure is
    settled by :func:`settle_failure` — and differs only in its row of this table: the
    stream and consumer, the one message type it takes, where its dead letters go, and
    how it finds the task."""

    stream = ""
    durable = ""
    filter_subject = ""
    batch = 256
    #: The one envelope type this router takes (None: any, e.g. actor mail).
    expects: MessageType | None = None
    log: Any = structlog.get_logger("ratchet.routing")

    #: Messages from people and the outside world are signed (docs/security.md): the
    #: service whose role the signer must hold (None: mail between the runtime's actors).
    signed_service: str | None = None
    #: Mail between the runtime's actors is sealed instead: the cluster's mail key, whose
    #: MAC each message must carry (protocol/mail_seal.py; None: not a mail consumer).
    seal: MailSeal | None = None

    def __init__(self, bus: Bus, tasks: TaskSupervision, store: TaskStore, clock: Clock,
                 authn: Authenticator | None = None) -> None:
        self.bus = bus
        self.tasks = tasks
        self.store = store
        self.clock = clock
        self.authn = authn

    async def serve(self) -> None:
        # A fetch returns as soon as a message is there; the timeout only bounds how often
        # an idle consumer asks again (a node holds 16 partitions' routers at most).
        self._delivering: set[asyncio.Task[None]] = set()
        self._room = asyncio.Event()
        self._room.set()
        try:
            await self.bus.pull_loop(self.stream, self.durable, self.filter_subject,
                                     self._batch, batch=self.batch, idle_timeout=5.0,
                                     before_fetch=self._room.wait)
        finally:  # stopping: the deliveries in progress go too (unacked: redelivered)
            for task in self._delivering:
                task.cancel()
            await asyncio.gather(*self._delivering, return_exceptions=True)

    async def _batch(self, msgs: list[Msg]) -> None:
        """Start one delivery per message; returns at once (see the module doc)."""
        name = f"ratchet.{self.signed_service}"
        for m in msgs:
            # Actor mail: its task's own trace carries it. A person's or a provider's
            # message (a decision, a confirmation): a span of its sender's trace.
            work = (self.route(m) if self.signed_service is None
                    else tracing.traced(self.route(m), name, m.headers, m.subject))
            task = asyncio.ensure_future(work)
            self._delivering.add(task)
            task.add_done_callback(self._delivered)
        if len(self._delivering) >= self.batch:
            self._room.clear()

    def _delivered(self, task: asyncio.Task[None]) -> None:
        self._delivering.discard(task)
        if len(self._delivering) < self.batch:
            self._room.set()

    async def route(self, msg: Msg) -> None:
        try:
            if self.seal is not None:  # dead-lettered (UNAUTHENTICATED) below if not sealed
                self.seal.check(msg.subject, msg.data, msg.headers)
            who = await self._signer(msg)
            env = decode_envelope(msg.data)
            if self.expects is not None and env.type != self.expects:
                raise InvalidMessage(f"expected {self.expects}, got {env.type!r}")
            target = await self.target(msg, env, who)
            if target is None:
                return  # settled already (acked, or NAK'ed for later)
            outcome = await deliver(self.tasks, target.task_id, target.envelope, msg,
                                    record=target.record)
            if outcome is None:
                return  # the task is between restarts: NAK'ed, tried again shortly
            self.delivered(target, outcome)
            await msg.ack()
        except Exception as exc:
            await settle_failure(msg, exc, store=self.store, clock=self.clock,
                                 dlq=self.dead_letters(msg), log=self.log)

    async def _signer(self, msg: Msg) -> Principal | None:
        if self.signed_service is None:
            return None
        if self.authn is None:
            raise Unauthenticated("this router has no keyring to check signatures with")
        # JetStream redelivers a message with its signature: no replay check here (the
        # approval ids and external waits a message names are one-time instead).
        return await self.authn.check(msg, self.signed_service, tenant_of(msg.subject),
                                      replay=False)

    async def target(self, msg: Msg, env: Envelope, who: Principal | None) -> Target | None:
        """The task this message goes to; None when the router settled it itself.
        ``who``: the verified signer (None for runtime mail)."""
        raise NotImplementedError

    def dead_letters(self, msg: Msg) -> str:
        """The dead-letter subject of a message this router cannot deliver."""
        raise NotImplementedError

    def delivered(self, target: Target, outcome: Any) -> None:
        self.log.info("delivered", task_id=target.task_id, outcome=outcome,
                      message_id=target.envelope.message_id)


async def deliver(tasks: TaskSupervision, task_id: str, env: Envelope, msg: Msg, *,
                  record: TaskRecord | None = None) -> Any | None:
    """Activate the task if needed and hand it ``env``; the actor's answer, or None when
    the message was NAK'ed for later (the task is between restarts). ``record``: the task's
    row, if the caller has just loaded it.

    A task whose partition another node owns is not activated here: the message is
    forwarded as mail to its partition (answer ``"forwarded"``; the caller acks)."""
    if not tasks.owns(task_id) and tasks.forward is not None:
        await tasks.forward(task_id, env)
        return "forwarded"
    ref = await tasks.ensure_running(task_id, record=record)
    if ref is None:
        await msg.nak(delay=redelivery_delay(msg))
        return None
    return await ref.ask(DeliverMail(env), timeout=60.0, correlation_id=env.correlation_id)


def given_up(msg: Msg, exc: Exception) -> HandlingFailed | None:
    """The error to dead-letter ``msg`` with when ``exc`` is unexpected (not a
    RatchetError) and the message has had :data:`GIVE_UP_AFTER` deliveries; else None."""
    if isinstance(exc, RatchetError) or deliveries(msg) < GIVE_UP_AFTER:
        return None
    return HandlingFailed(f"handling failed on {deliveries(msg)} deliveries: {exc!r}"[:2000],
                          subject=msg.subject, exception=type(exc).__name__)


async def settle_failure(msg: Msg, exc: Exception, *, store: TaskStore, clock: Clock, dlq: str,
                         log: Any) -> None:
    """Ack, NAK or dead-letter a message whose delivery raised ``exc``.

    Retryable RatchetErrors (the store or the task actor unavailable, a lease moving) are
    the node's condition, not the message's: they are NAK'ed for as long as it lasts.
    Anything unexpected is NAK'ed up to :data:`GIVE_UP_AFTER` deliveries, then
    dead-lettered with the exception."""
    if isinstance(exc, TaskFinished):
        await msg.ack()
        return
    if isinstance(exc, ActorCrashed) and getattr(exc.__cause__, "ends_actor", False):
        await msg.nak(delay=redelivery_delay(msg))  # fenced: not the message's fault
        return
    if isinstance(exc, ActorCrashed) and deliveries(msg) >= POISON_AFTER:
        # The actor crashed on this message every time: a poison message, not a transient
        # failure. Dead-letter it before it uses up the task's restart intensity.
        exc = InvalidMessage(f"message crashed its actor {POISON_AFTER} times: "
                             f"{exc.__cause__!r}", subject=msg.subject)
    exc = given_up(msg, exc) or exc
    if isinstance(exc, RatchetError) and not exc.retryable:
        log.warning("message dead-lettered", subject=msg.subject, error=exc.message)
        try:
            await store.record_dead_letter(subject=msg.subject, raw=msg.data,
                                           error=exc.to_wire(), dlq_subject=dlq, now=clock.now(),
                                           headers=msg.headers)
        except Exception as store_exc:  # not recorded: keep it in the stream for later
            log.error("dead-letter failed", error=repr(store_exc))
            await msg.nak(delay=redelivery_delay(msg))
            return
        await msg.ack()
        return
    if not isinstance(exc, RatchetError):
        log.error("routing failed; will retry", subject=msg.subject, error=repr(exc))
    await msg.nak(delay=redelivery_delay(msg))
