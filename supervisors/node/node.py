"""The node: the root supervisor of one Ratchet process.

Start order: audit seal → store (and its secret key, supervisors/node/secret_key.py) → the
checks that refuse a start (partition count, node id in use: leases.check_start) → NATS
(embedded or joined, connected within a bound: nats_link.py) → streams → root supervisor
with what tasks need {outbox relay, tasks, mail routers, leases} → leases taken and every
unfinished task of their partitions recovered (running from here) → the other children
{api, admin, timers, schedules, sweepers, external and decision routers, intake}
(start_order.py); then, in the background, the check of the audit chain. Each phase's
duration is kept in ``startup`` (startup.py). A start that
fails or is cancelled stops what it had started (``Node.stop``) before it raises.
Stop order (idempotent): stop intake, the routers and timers (no new work) → stop the tasks
supervisor (each task stops at its next step boundary, its safe point) → flush the outbox
→ release the leases (all of that within ``drain_timeout``, or sooner after ``hurry``) →
stop the rest → close NATS → close the store → stop the embedded server.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from ratchet.actors.core.actor import ActorRef, ActorSystem
from ratchet.actors.effects.local_tools import LocalToolWorker
from ratchet.actors.effects.remote_tool import JetStreamTools
from ratchet.actors.effects.switches import Switches
from ratchet.actors.effects.tool_calls import ToolCalls
from ratchet.actors.task.actor import TaskDeps
from ratchet.actors.transport.bus import Bus
from ratchet.actors.workflow.registry import Registry
from ratchet.persistence.audit_check import AuditReport
from ratchet.persistence.ports import StorePort
from ratchet.protocol.auth import redact_url
from ratchet.protocol.clock import Clock, SystemClock
from ratchet.protocol.clock_guard import ClockGuard, ClockStep
from ratchet.protocol.codec import encode
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import STREAM_MAIL, mail_subject
from ratchet.supervisors.node.config import NodeConfig
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.supervisors.node.held_leases import HeldLeases
from ratchet.supervisors.node.leases import LeaseHooks, LeaseManager, LeaseSettings, check_start
from ratchet.supervisors.node.nats_auth import NatsAuthorization
from ratchet.supervisors.node.nats_link import link_nats
from ratchet.supervisors.node.node_events import NodeEvents
from ratchet.supervisors.node.node_trust import check_audit, open_store, trust, unlock_secrets
from ratchet.supervisors.node.partitions import PartitionWork
from ratchet.supervisors.node.shutdown import (
    AFTER_DRAIN,
    AFTER_INCOMPLETE_DRAIN,
    Drain,
    close_in_order,
)
from ratchet.supervisors.node.start_order import load_later_children, start_the_rest
from ratchet.supervisors.node.startup import StartupPhases
from ratchet.supervisors.node.store_figures import store_figures
from ratchet.supervisors.services.mail_router import MailRouter
from ratchet.supervisors.services.outbox_relay import OutboxRelay
from ratchet.supervisors.supervision.restart_policy import Restart
from ratchet.supervisors.supervision.scheduler import FairScheduler
from ratchet.supervisors.supervision.supervisor import ChildSpec, Supervisor, WhichChildren
from ratchet.supervisors.supervision.tasks import TaskSupervision

if TYPE_CHECKING:  # imported on a thread while the node starts (start_order.py)
    from ratchet.supervisors.node.later_children import LaterDeps

__all__ = ["Node", "NodeConfig"]  # NodeConfig: supervisors/node/config.py

log = structlog.get_logger("ratchet.node")


class Node:
    def __init__(self, config: NodeConfig, registry: Registry, clock: Clock | None = None,
                 lease_clock: Clock | None = None, startup: StartupPhases | None = None) -> None:
        self.config = config
        #: Where the start went, phase by phase (supervisors/node/startup.py).
        self.startup = startup or StartupPhases()
        self.registry = registry
        # The node's clock, with steps of its wall clock detected and forward ones held
        # (timers and deadlines are judged by its due_now()).
        self.clock = ClockGuard(clock or SystemClock(), config.clock_step_threshold,
                                config.clock_step_hold, on_step=self._clock_stepped)
        # This node's own view of its leases' validity: monotonic time, not the tasks' clock
        # (which a test may move by hours); their expiry in the store is on the store's
        # time (persistence/leases.py), never on a node's wall clock.
        self.lease_clock = lease_clock or SystemClock()
        self.events = NodeEvents(config.node_id, self.clock)
        self.system = ActorSystem(self.clock)
        self.store: StorePort | None = None
        self.bus: Bus | None = None
        self.embedded: EmbeddedNats | None = None
        #: Every tool call's way to its worker, and the node's own worker (set at start).
        self.tool_calls: ToolCalls | None = None
        self.local_tools: LocalToolWorker | None = None
        #: The embedded server's users (None on an external NATS): nats_auth.py.
        self.nats_auth: NatsAuthorization | None = None
        self._nats_server: EmbeddedNats | None = None  # the embedded server, ours or joined
        self.url: str | None = None
        self.tasks: TaskSupervision | None = None
        self.root: ActorRef[Supervisor] | None = None
        self.relay: OutboxRelay | None = None
        self.leases: LeaseManager | None = None
        self._stopped = False
        self._started = False
        self._drain = Drain(config.drain_timeout)  # supervisors/node/shutdown.py
        #: Why the database file was lost under this node, once noticed (file_watch.py).
        self.store_lost: str | None = None
        #: Set when the root supervisor gave up (restart intensity exceeded): the process
        #: should exit rather than linger half-alive.
        self.failed = asyncio.Event()
        #: The audit chain's check at start (None until done, or if it could not run).
        self.audit_report: AuditReport | None = None
        self.audit_checked = asyncio.Event()
        self._audit_check: asyncio.Task[None] | None = None

    @property
    def _store(self) -> StorePort:
        assert self.store is not None
        return self.store

    async def start(self) -> None:
        """Start in the documented order.

        Raises:
            StartRefused: its code says why (NODE_ID_IN_USE, PARTITION_COUNT_MISMATCH,
                STORE_READ_ONLY, NATS_UNREACHABLE, NATS_PORT_TAKEN); raised, as any other
                failure or a cancel, after what had started was stopped: no thread,
                connection or server is left behind.
        """
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        cfg = self.config
        # The leases this node holds: written by its lease manager, read by the store (the
        # fencing token of every task write) and by task supervision (which tasks are ours).
        self.holding = HeldLeases(cfg.node_id, cfg.partitions, self.lease_clock)
        self.store = await open_store(cfg, self.holding)
        self.store.on_file_lost(self._file_lost)
        self.startup.mark("store")
        # Refused here, before NATS or any child starts, at once (the lease manager checks
        # again as it starts).
        await check_start(self.store, cfg.node_id, cfg.partitions, cfg.lease_ttl)
        # Mail between nodes is sealed with the store's shared key (protocol/mail_seal.py).
        self.seal, self.authn = await trust(self.store, cfg, self.clock)
        await unlock_secrets(self.store, cfg)  # SecretUnreadable: not this store's key
        self.startup.mark("checks")
        link = await link_nats(cfg, self._store)
        self.startup.mark("nats")
        self.url, self.bus, self.node_key = link.url, link.bus, link.node_key
        self.nats_auth, self.embedded, self._nats_server = link.auth, link.embedded, link.server
        self.events.attach(bus := link.bus)
        # Before any timer is judged, and before this node's first heartbeat replaces the
        # reading its previous run left: a clock wrong since the start is a step too.
        self.clock.judge_start([n.info for n in await self._store.nodes()])
        self.switches = Switches(risk=cfg.risk_policy)  # tool tiers tightened per tenant
        self.switches.load(await self._store.switches())
        # Every tool call: in-process tools through the node's own worker, remote ones over
        # JetStream (actors/effects/tool_calls.py).
        self.local_tools = LocalToolWorker(self.clock)
        self.tool_calls = ToolCalls(self.clock, self._store, local=self.local_tools, remote=(
            JetStreamTools(bus, cfg.node_id, cfg.streams, cfg.nats_replicas)))
        self._task_supervision()
        leases = self._partition_leases(bus)
        await bus.forget_consumer(STREAM_MAIL, "mail-router")  # before per-partition mail
        # Resume first: the children the tasks need, the leases and the tasks; then the rest
        # (supervisors/node/start_order.py).
        root = Supervisor(self.system, "node", self._first_children(bus, leases),
                          max_restarts=10, period=60.0, backoff_base=0.1, backoff_cap=5.0)
        self.root = root_ref = self.system.spawn(root, "node", on_exit=self._root_exited)
        self._started = True
        await root_ref.ask(WhichChildren(), timeout=30.0)  # answered after on_start
        await leases.start()  # takes a share of the partitions and recovers their tasks
        self.startup.mark("resume")
        # The other children's modules, imported on a thread while the tasks run
        # (supervisors/node/start_order.py).
        deps, children = await load_later_children()
        await start_the_rest(self.system, root_ref, children(self._later_deps(deps, bus)))
        self.startup.mark("services")
        self._audit_check = asyncio.create_task(self._check_audit())
        log.info("node started", node=cfg.node_id, url=redact_url(self.url), db=cfg.store_name,
                 workflows=self.registry.names())

    async def _check_audit(self) -> None:
        try:
            self.audit_report = await check_audit(self._store, self.events)
        finally:
            self.audit_checked.set()

    def _task_supervision(self) -> None:
        """The tasks supervisor, its fair scheduler, and what every task actor gets."""
        cfg, calls = self.config, self.tool_calls
        assert calls is not None
        deps = TaskDeps(self._store, self.registry, self.clock, cfg.node_id,
                        max_step_attempts=cfg.max_step_attempts, switches=self.switches,
                        max_recoveries=cfg.max_recoveries, recovery_window=cfg.recovery_window,
                        progress_interval=cfg.progress_interval, partitions=cfg.partitions,
                        max_value_bytes=cfg.max_value_bytes,
                        max_checkpoint_bytes=cfg.max_checkpoint_bytes,
                        cancel_timeout=cfg.cancel_timeout, remote_ask=calls)
        self.scheduler = FairScheduler(max_running=cfg.max_running, quotas=cfg.tenant_quotas,
                                       weights=cfg.tenant_weights, max_queued=cfg.max_queued)
        self.tasks = TaskSupervision(
            self.system, deps, scheduler=self.scheduler, ownership=self.holding,
            forward=self._forward_mail, max_restarts=cfg.task_max_restarts,
            period=cfg.task_restart_period, backoff_base=cfg.task_backoff_base,
            backoff_cap=cfg.task_backoff_cap)
        self.tasks.branch_host.publish = self._send_mail

    def _partition_leases(self, bus: Bus) -> LeaseManager:
        """This node's partition work, and the lease manager that hands it partitions."""
        cfg = self.config
        store, tasks = self._store, self._tasks
        self.work = PartitionWork(
            node_id=cfg.node_id, partitions=cfg.partitions, store=store, tasks=tasks,
            mail_supervisor=lambda: self.system.lookup("node/mail"),
            make_router=lambda p: MailRouter(bus, tasks, store, self.clock, p, self.seal),
            flush_outbox=self._flush_outbox, activate=tasks.activate_or_release,
            forget=tasks.forget_partitions)
        self.leases = leases = LeaseManager(
            store, self.lease_clock, cfg.node_id, cfg.partitions,
            LeaseHooks(acquired=self.work.acquired, lost=self.work.lost,
                       handing_over=self.work.handing_over,
                       resumed=lambda ps: self.work.recover(set(ps)), info=self._heartbeat_info,
                       each_tick=self._each_tick),
            LeaseSettings(ttl=cfg.lease_ttl, interval=cfg.lease_interval), self.holding)
        return leases

    def _first_children(self, bus: Bus, leases: LeaseManager) -> list[ChildSpec]:
        """The root supervisor's children that resumed tasks need, in start order (the
        others: :meth:`_later_deps`)."""
        store, tasks = self._store, self._tasks

        def relay(_: int) -> OutboxRelay:
            self.relay = OutboxRelay(bus, store, self.clock, self.seal)
            return self.relay

        return [
            ChildSpec("outbox", relay, Restart.PERMANENT, shutdown_timeout=10.0),
            tasks.root_spec(),
            # One mail router per partition held, started and stopped by the lease manager.
            ChildSpec("mail", lambda _: Supervisor(self.system, "mail", [], max_restarts=50,
                                                   period=60.0), Restart.PERMANENT),
            ChildSpec("leases", lambda _: leases, Restart.PERMANENT, shutdown_timeout=5.0),
        ]

    def _later_deps(self, deps: type[LaterDeps], bus: Bus) -> LaterDeps:
        """What the children started after the resume are made of (later_children.py)."""
        assert self.leases is not None
        return deps(config=self.config, store=self._store, bus=bus, registry=self.registry,
                    clock=self.clock, system=self.system, tasks=self._tasks,
                    scheduler=self.scheduler, authn=self.authn, switches=self.switches,
                    leases=self.leases, node_key=self.node_key,
                    wait_for_room=self._wait_for_room, keyring_changed=self._keyring_changed)

    def writer_summary(self) -> dict[str, Any]:
        """Group-commit and WAL figures (supervisors/node/store_figures.py)."""
        if self.store is None:
            return {}
        return {**store_figures(self.store),
                **({"db_lost": self.store_lost, "db_rescued_to": self.store.rescued_to}
                   if self.store_lost is not None else {})}

    def _file_lost(self, reason: str) -> None:
        """The database file was deleted or replaced: every write is refused from now on
        (``StoreFileLost``), intake stops fetching, and the node fails so that ``serve``
        stops it (the store puts the data back at close) and exits 1."""
        if self.store_lost is not None:
            return
        self.store_lost = reason
        log.critical("database file lost: this node accepts no more work and stops",
                     reason=reason, db=self.config.store_name)
        self.failed.set()

    async def _wait_for_room(self) -> None:
        if self.store_lost is not None:
            await asyncio.Event().wait()  # intake pauses until the node stops it
        await self.scheduler.wait_for_room()

    def _root_exited(self, _: ActorRef[Any], reason: BaseException | None) -> None:
        if reason is not None and not self._stopped:
            log.critical("node supervisor gave up", error=repr(reason))
            self.failed.set()

    async def recover(self) -> int:
        """Activate every unfinished task of the partitions held; returns how many."""
        assert self.leases is not None
        return await self.work.recover(set(self.leases.held))

    async def _send_mail(self, subject: str, env: Envelope) -> None:
        """Branch mail (actors/task/branch_host.py), sealed; its message id is its own."""
        assert self.bus is not None
        data = encode(env)
        await self.bus.js.publish(subject, data, headers={
            "Nats-Msg-Id": env.message_id, **self.seal.headers(subject, data)})

    async def _forward_mail(self, task_id: str, env: Envelope) -> None:
        # Its own message id for the stream (the original may be in the same stream's
        # duplicate window); the task's inbox still dedupes by the envelope's id.
        assert self.bus is not None
        subject, data = mail_subject(task_id, "task", self.config.partitions), encode(env)
        await self.bus.js.publish(subject, data, headers={
            "Nats-Msg-Id": f"fwd:{env.message_id}", **self.seal.headers(subject, data)})

    async def _flush_outbox(self) -> None:
        if self.relay is not None:
            await self.relay.flush(timeout=5.0)

    def _heartbeat_info(self) -> dict[str, Any]:
        # Shown by `admin nodes` (viewer): a password in the URL never leaves the node.
        return {"url": redact_url(self.url), "live_tasks": len(self._tasks.live_actors()),
                "unsealed_refused": self.seal.refused, **self.clock.status()}

    def _clock_stepped(self, step: ClockStep) -> None:
        # Runs in whatever read the clock first after the step: log only, never raise.
        log.error("wall clock stepped", node=self.config.node_id, seconds=round(step.seconds, 3),
                  held=round(step.held, 3), hold=self.config.clock_step_hold,
                  steps=self.clock.steps, reference=step.reference,
                  effect="timers and deadlines made due by the step wait until the clock has"
                         " been steady for the hold, or `ratchet admin clock-ack`"
                  if step.held else "nothing held (a backward step: timers fire late)")
        self.events.clock_stepped(step)

    async def _keyring_changed(self) -> None:
        """After a grant or a revoke: the embedded server's users follow the keyring."""
        if self.nats_auth is not None and self._nats_server is not None:
            await self.nats_auth.refresh(self._nats_server)

    async def _each_tick(self) -> None:
        await self._reload_switches()
        try:  # a key that expired, or a grant made through another node of this state dir
            await self._keyring_changed()
        except Exception as exc:  # retried at the next tick; the lease loop must go on
            log.warning("nats users not reloaded", error=repr(exc))

    async def _reload_switches(self) -> None:
        # Another node may have flipped a kill switch: each node re-reads them every tick.
        was_frozen = self.switches.frozen_scopes
        self.switches.load(await self._store.switches())
        if was_frozen - self.switches.frozen_scopes:
            self._tasks.wake_all()  # thawed on another node: waiting tasks here go on too

    @property
    def _tasks(self) -> TaskSupervision:
        assert self.tasks is not None
        return self.tasks

    async def stop(self) -> None:
        """Drain and shut down, in the documented order. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        if self._audit_check is not None and not self._audit_check.done():
            self._audit_check.cancel()
            await asyncio.wait([self._audit_check])  # its end; a cancel of stop() still raises
        root = self.root
        log.info("node stopping", node=self.config.node_id, drain_timeout=self._drain.timeout)
        if self.leases is not None:
            self.leases.stopping = True  # renew only: take no partition while stopping
        if root is not None and root.is_alive:
            drained = await self._drain.run(root, self.relay, self.leases)
            await root.stop_and_wait(AFTER_DRAIN if drained else AFTER_INCOMPLETE_DRAIN)
        await close_in_order([("nats", self.bus.close if self.bus else None),
                              ("store", self.store.close if self.store else None),
                              ("embedded nats-server",
                               self.embedded.stop if self.embedded else None)])
        log.info("node stopped", node=self.config.node_id)

    def hurry(self) -> None:
        """Cut the drain short (a second Ctrl-C): what has not stopped yet is stopped
        without waiting for a safe point (its tasks resume from their checkpoints)."""
        self._drain.hurry()

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
