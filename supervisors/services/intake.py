"""Intake: turns submit messages into tasks, exactly once per (tenant, idempotency key).

Producers publish an :class:`~protocol.messages.Envelope` of type ``task.submit`` on
``ratchet.submit.<tenant>`` (JetStream, ``Nats-Msg-Id`` = ``<tenant>:<idempotency key>``,
so JetStream drops repeats within its window; the tenant prefix because that window is per
stream and two tenants may use the same key). The Store's ``requests`` table is the lasting
guard: same key and same request → the same task; same key and a different request → a
typed CONFLICT, recorded and answered, no second task. The answer goes to the envelope's
``reply_to`` only if that is an inbox of a key of the submit's tenant (docs/security.md).
A message that cannot be decoded or validated is dead-lettered with its error and acked
(its sender answered if a reply subject can be read from it); one whose handling keeps
raising something unexpected is retried up to ``GIVE_UP_AFTER`` deliveries, then
dead-lettered with the exception: it never stops the node, nor comes back for ever.

A workflow with an ``input_model`` has its input validated here (INVALID_ARGUMENT when it
does not) and stored with its secrets sealed (protocol/secrets.py); a dead-lettered submit
of such a workflow is kept with its input redacted, since it may hold them in clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from nats.aio.msg import Msg

from ratchet.actors.core.actor import ServiceActor
from ratchet.actors.transport.bus import STREAM_GONE, Bus, redelivery_delay
from ratchet.actors.workflow.registry import Registry
from ratchet.persistence.ports import TaskStore
from ratchet.persistence.txns import NewTask
from ratchet.protocol import tracing
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.clock import Clock
from ratchet.protocol.codec import decode_envelope, decode_map, encode, parse_body, reply_route
from ratchet.protocol.errors import (
    InvalidMessage,
    RatchetError,
    RateLimited,
    RequestConflict,
    Unavailable,
)
from ratchet.protocol.ids import new_id, request_hash, task_id_for
from ratchet.protocol.messages import Envelope, Reply, StartTask, SubmitTask, TaskAccepted
from ratchet.protocol.redaction import REDACTED
from ratchet.protocol.subjects import (
    STREAM_SUBMIT,
    check_token,
    dlq_subject,
    is_token,
    mail_subject,
    tenant_of,
)
from ratchet.supervisors.services.authn import Authenticator
from ratchet.supervisors.services.canary import Routes, check_routes, routed_version
from ratchet.supervisors.services.rate_limits import SubmitLimits
from ratchet.supervisors.services.request_service import error_reply
from ratchet.supervisors.services.routing import given_up

__all__ = ["Acceptor", "IntakeActor"]

log = structlog.get_logger("ratchet.intake")


class Acceptor:
    """Validation and acceptance shared by the JetStream intake and the request/reply API."""

    def __init__(self, store: TaskStore, registry: Registry, clock: Clock, producer: str,
                 partitions: int, has_room: Callable[[], bool] | None = None,
                 wait_for_room: Callable[[], Awaitable[Any]] | None = None,
                 limits: SubmitLimits | None = None, routes: Routes | None = None) -> None:
        self.store = store
        #: Canary routes of new tasks between versions (supervisors/services/canary.py).
        self.routes: Routes = dict(routes or {})
        check_routes(self.routes, registry)
        #: Per-tenant submit rate limits (RATE_LIMITED past them); None: none.
        self.limits = limits
        #: Backpressure: whether this node can take more queued work (its admission queue
        #: is bounded); the JetStream intake waits, the request/reply API answers BUSY.
        self.has_room = has_room or (lambda: True)
        self.wait_for_room = wait_for_room
        self.registry = registry
        self.clock = clock
        self.producer = producer
        self.partitions = partitions

    async def accept(self, tenant: str, env: Envelope) -> TaskAccepted:
        """Create (or find) the task for a submit envelope.

        Raises:
            InvalidMessage: wrong type or body; UnknownWorkflow: not served here;
            RequestConflict: the key was used before with a different request;
            RateLimited: the tenant submits faster than its limit.
        """
        check_token(tenant, "tenant")
        if self.limits is not None:
            self.limits.take(tenant)
        if not self.has_room():
            raise Unavailable("this node's queue of tasks waiting to run is full; retry later")
        if env.type != MessageType.TASK_SUBMIT:
            raise InvalidMessage(f"expected type task.submit, got {env.type!r}", type=env.type)
        body = parse_body(env, SubmitTask)
        # No version asked for: a canary route may pick one, else the latest (canary.py).
        version = body.workflow_version or routed_version(self.routes, body.workflow,
                                                          body.idempotency_key)
        workflow = self.registry.get(body.workflow, version)
        task_input = workflow.parse_input(body.input) if workflow.input_model else body.input
        # Secrets sealed in the hash too: deterministic, so a resubmission still matches,
        # and a digest of the clear value would be an oracle for guessing it.
        sealed = self.store.secrets.canonical
        digest = request_hash(sealed({"workflow": workflow.name, "version": workflow.version,
                                      "input": task_input, "deadline_s": body.deadline_s,
                                      "budget": body.budget.model_dump() if body.budget
                                      else None}))
        task_id = task_id_for(tenant, body.idempotency_key)
        if tracing.enabled():  # the intake span: the parent of every span of the task
            tracing.set_attributes({"ratchet.task_id": task_id, "ratchet.tenant": tenant,
                                    "ratchet.idempotency_key": body.idempotency_key,
                                    "ratchet.workflow": workflow.name})
        now = self.clock.now()
        start = Envelope(
            type=MessageType.TASK_START, message_id=new_id("msg"),
            correlation_id=env.correlation_id, causation_id=env.message_id, sent_at=now,
            body=StartTask(task_id=task_id, tenant=tenant, priority=body.priority).model_dump(),
        )
        result = await self.store.accept_submission(NewTask(
            task_id=task_id, tenant=tenant, workflow=workflow.name,
            workflow_version=workflow.version, idempotency_key=body.idempotency_key,
            request_hash=digest, input=sealed(task_input), steps_total=workflow.step_count,
            deadline_at=now + body.deadline_s if body.deadline_s else None, now=now,
            budget=body.budget.model_dump(exclude_none=True) if body.budget else None,
            producer=self.producer, message_id=env.message_id,
            traceparent=tracing.current_traceparent(),
            definition_hash=self.registry.definition_hash(workflow.name, workflow.version),
            start_mail=(mail_subject(task_id, "task", self.partitions), start.message_id,
                        encode(start)),
        ))
        if result.conflict:
            raise RequestConflict(
                "idempotency key already used with a different request",
                tenant=tenant, idempotency_key=body.idempotency_key, task_id=result.task_id,
            )
        log.info("task accepted" if result.created else "duplicate submission",
                 task_id=result.task_id, tenant=tenant, correlation_id=env.correlation_id)
        return TaskAccepted(task_id=result.task_id, status=result.status, created=result.created)

    async def dead_letter(self, subject: str, raw: bytes, exc: RatchetError, tenant: str,
                          headers: dict[str, str] | None = None) -> None:
        log.warning("message dead-lettered", subject=subject, code=exc.code.value,
                    error=exc.message, details=exc.details)
        await self.store.record_dead_letter(
            subject=subject, raw=self._without_secret_input(raw), error=exc.to_wire(),
            dlq_subject=dlq_subject("submit", tenant), now=self.clock.now(), headers=headers,
        )


    def _without_secret_input(self, raw: bytes) -> bytes:
        """``raw`` as a dead letter keeps it: the submit of a workflow whose input declares
        secrets has its input replaced by REDACTED (it failed, perhaps validation, so its
        secrets were never sealed). Anything that cannot be read as such a submit is kept."""
        try:
            env = decode_map(raw)
            body = env["body"]
            workflow = self.registry.get(body["workflow"], body.get("workflow_version"))
        except (RatchetError, KeyError, TypeError, AttributeError):  # not a submit of a workflow known here
            return raw
        if not workflow.has_secret_input or "input" not in body:
            return raw
        return encode({**env, "body": {**body, "input": REDACTED}})


def intake_durable(subject: str) -> str:
    """The durable consumer of one submit subject: ``intake-<tenant>`` (a subject whose
    tenant token is not valid gets a digest instead; its messages are dead-lettered)."""
    tenant = tenant_of(subject)
    if is_token(tenant):
        return f"intake-{tenant}"
    return f"intake-x{zlib.crc32(subject.encode()):08x}"


#: Every submit subject (the stream's), and the queue group of the nodes' look-out for new
#: tenants on them: one node sees each submission.
SUBMIT_SUBJECTS = "ratchet.submit.>"
INTAKE_LOOKOUT = "ratchet-intake"
#: Seconds from the first scan of the submit subjects to the second (``_next_scan_after``).
FIRST_RESCAN = 0.5


class IntakeActor(ServiceActor):
    """Consumes ``ratchet.submit.<tenant>`` and acks each message after its outcome committed.

    One durable consumer per submit subject, that is per tenant, each pulled by its own
    loop: a tenant that floods 10,000 submissions waits behind its own queue, not another
    tenant's — the stream alone is first-come first-served across tenants. A loop whose
    subject stays empty for ``idle_after`` seconds ends until messages come back.

    A tenant's loop starts at its first submission: the nodes listen to the submit subjects
    on core NATS too (queue group ``ratchet-intake``: one node gets each copy) and the
    first message of a subject with no loop starts one there, so a new tenant is served as
    fast as any other. The cost is one more delivery of every submission, to one node. (A
    wildcard JetStream consumer cannot do it: a work-queue stream refuses consumers whose
    filters overlap, and one consumer for every tenant would queue a flood in front of
    everyone.) A scan of the stream's subjects every ``rescan_interval`` is the backstop,
    for messages that came while no node listened.
    """

    def __init__(self, bus: Bus, acceptor: Acceptor, authn: Authenticator, batch: int = 128,
                 rescan_interval: float = 5.0, idle_after: float = 60.0) -> None:
        self.bus = bus
        self.acceptor = acceptor
        self.authn = authn
        self.batch = batch
        self.rescan_interval = rescan_interval
        self.idle_after = idle_after
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        #: Subjects with a submission seen since their loop's last fetch began.
        self._seen: set[str] = set()

    async def serve(self) -> None:
        # The single consumer of earlier releases would overlap the per-tenant ones (a
        # work-queue stream refuses that).
        await self.bus.forget_consumer(STREAM_SUBMIT, "intake")
        # The tenants' loops are this one's children: stopping intake stops and awaits
        # them (a loop that fails logs and starts again after a pause).
        async with asyncio.TaskGroup() as self._group:
            lookout = await self.bus.nc.subscribe(SUBMIT_SUBJECTS, queue=INTAKE_LOOKOUT,
                                                  cb=self._submitted)
            try:
                scans = 0
                while True:
                    for subject in await self._subjects():
                        self._ensure_loop(subject)
                    scans += 1
                    # Loop time, not the task clock: this polls NATS, it is no task's timer.
                    await asyncio.sleep(self._next_scan_after(scans))
            finally:
                self._group = None
                with contextlib.suppress(Exception):  # the connection may be closing
                    await lookout.unsubscribe()

    def _next_scan_after(self, scans: int) -> float:
        # A submission published as the look-out subscribed can miss it (routed just before
        # the subscription) and the first scan too (still in the stream's ingest queue as
        # the scan listed the subjects): the second scan comes a moment after the first.
        return min(FIRST_RESCAN, self.rescan_interval) if scans == 1 else self.rescan_interval

    async def _submitted(self, msg: Msg) -> None:
        """A submission seen on core NATS (its JetStream copy is the one handled)."""
        self._ensure_loop(msg.subject)

    def _ensure_loop(self, subject: str) -> None:
        loop = self._loops.get(subject)
        if loop is not None and not loop.done():
            self._seen.add(subject)
        elif self._group is not None:
            self._loops[subject] = self._group.create_task(self._consume(subject))

    async def _subjects(self) -> list[str]:
        try:
            info = await self.bus.js.stream_info(STREAM_SUBMIT, subjects_filter=SUBMIT_SUBJECTS)
        except STREAM_GONE as exc:  # deleted under the node: create it again, not a crash
            await self.bus.restore_streams(exc)
            return []
        return list(info.state.subjects or {})

    async def _consume(self, subject: str) -> None:
        failures = 0
        while True:
            try:
                await self._consume_until_idle(subject)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # this tenant's loop only: it starts again shortly
                failures += 1
                log.error("intake loop failed", subject=subject, error=repr(exc),
                          failures=failures)
                # Loop time (it paces NATS calls); doubling, capped by the backstop scan's
                # period, so a lasting fault is not retried in a tight loop.
                await asyncio.sleep(min(0.5 * 2 ** min(failures, 10), self.rescan_interval))

    async def _consume_until_idle(self, subject: str) -> None:
        while True:
            await self.bus.pull_loop(
                STREAM_SUBMIT, intake_durable(subject), subject, self._handle_batch,
                batch=self.batch, before_fetch=lambda: self._before_fetch(subject),
                # A node that dies holding a batch delays those submissions by this
                # much; handling one twice is harmless (the key).
                ack_wait=10.0, idle_exit=self.idle_after,
                # The server forgets the consumer of a tenant gone quiet for a day.
                inactive_threshold=86_400.0)
            if subject not in self._seen:
                return  # idle, and nothing came as it ended

    async def _before_fetch(self, subject: str) -> None:
        # Seen from now on: this fetch takes it, or, should the loop end idle meanwhile,
        # it goes on (_consume) instead of leaving the message to the next scan.
        self._seen.discard(subject)
        if self.acceptor.wait_for_room is not None:
            await self.acceptor.wait_for_room()

    async def _handle_batch(self, msgs: list[Msg]) -> None:
        # Each submit in its own span, child of the producer's (its traceparent header).
        await asyncio.gather(*(tracing.traced(self._handle(m), "ratchet.intake", m.headers,
                                              m.subject) for m in msgs))

    async def _handle(self, msg: Msg) -> None:
        tenant = tenant_of(msg.subject)
        env: Envelope | None = None
        try:
            env = decode_envelope(msg.data)
            accepted = await self.acceptor.accept(tenant, env)
            result: TaskAccepted | RatchetError = accepted
        except RequestConflict as exc:
            result = exc
        except Exception as exc:
            failure = exc if isinstance(exc, RatchetError) else given_up(msg, exc)
            # Over its rate the tenant is answered and the submit dead-lettered (kept,
            # for an operator to replay), not left in the stream to come back for ever.
            if failure is None or (failure.retryable and not isinstance(failure, RateLimited)):
                # Retryable RatchetErrors are the node's condition (its store unavailable,
                # its queue full): retried for as long as it lasts. Anything unexpected is
                # retried up to GIVE_UP_AFTER deliveries, then dead-lettered with it.
                log.warning("intake will retry", error=repr(exc), subject=msg.subject)
                await msg.nak(delay=redelivery_delay(msg))
                return
            try:
                await self.acceptor.dead_letter(msg.subject, msg.data, failure, tenant,
                                                msg.headers)
            except Exception as store_exc:  # the store could not record it: let JetStream retry
                log.error("dead-letter failed", error=repr(store_exc))
                await msg.nak(delay=redelivery_delay(msg))
                return
            result = failure
        # An envelope that failed validation still gets its typed error when its reply
        # subject (and correlation id) can be read from the raw map.
        reply_to, correlation_id = ((env.reply_to, env.correlation_id) if env is not None
                                    else reply_route(msg.data))
        # The reply subject comes from the payload: answered only under an inbox of a key
        # of this tenant, never on a subject the node would otherwise write (a confused
        # deputy). The task stands either way.
        if reply_to and await self.authn.may_answer(reply_to, tenant):
            await self._respond(reply_to, error_reply(result, correlation_id)
                                if isinstance(result, RatchetError) else
                                Reply(ok=True, correlation_id=correlation_id,
                                      result=result.model_dump()))
        await msg.ack()

    async def _respond(self, subject: str, reply: Reply) -> None:
        try:
            await self.bus.nc.publish(subject, encode(reply))
        except Exception as exc:  # a reply is a courtesy; the task stands
            log.warning("reply failed", subject=subject, error=repr(exc))
