"""The node's children started after its tasks resumed (supervisors/node/start_order.py):
the request services (api, admin), timers, schedules, drift, the sweepers (recovery,
retention, settle), the external and decision routers and intake, in that order.

None of them runs before the resume, so neither are their modules imported: the node
imports this module (and with it the ~30 modules of ``supervisors/services`` the tasks do
not use) on a thread while it waits for NATS, and builds these children's specs once its
tasks run (docs/operations.md, "Restart (W4)").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ratchet.actors.core.actor import ActorSystem
from ratchet.actors.effects.switches import Switches
from ratchet.actors.transport.bus import Bus
from ratchet.actors.workflow.registry import Registry
from ratchet.persistence.ports import StorePort
from ratchet.protocol.clock_guard import ClockGuard
from ratchet.supervisors.node.config import NodeConfig
from ratchet.supervisors.node.leases import LeaseManager
from ratchet.supervisors.services.action_sweeper import ActionSweeper
from ratchet.supervisors.services.admin import AdminActor
from ratchet.supervisors.services.admin_keys import KeyringHooks
from ratchet.supervisors.services.api import ApiActor
from ratchet.supervisors.services.authn import Authenticator
from ratchet.supervisors.services.decisions import DecisionRouter
from ratchet.supervisors.services.drift import DriftService
from ratchet.supervisors.services.external import ExternalRouter
from ratchet.supervisors.services.intake import Acceptor, IntakeActor
from ratchet.supervisors.services.rate_limits import SubmitLimits
from ratchet.supervisors.services.recovery import RecoverySweeper
from ratchet.supervisors.services.retention import RetentionSweeper
from ratchet.supervisors.services.schedules import ScheduleService
from ratchet.supervisors.services.timers import TimerService
from ratchet.supervisors.supervision.restart_policy import Restart
from ratchet.supervisors.supervision.scheduler import FairScheduler
from ratchet.supervisors.supervision.supervisor import ChildSpec
from ratchet.supervisors.supervision.tasks import TaskSupervision

__all__ = ["LaterDeps", "later_children"]


@dataclass(frozen=True)
class LaterDeps:
    """What these children are made of: the node's parts, all in place once it resumed."""

    config: NodeConfig
    store: StorePort
    bus: Bus
    registry: Registry
    clock: ClockGuard
    system: ActorSystem
    tasks: TaskSupervision
    scheduler: FairScheduler
    authn: Authenticator
    switches: Switches
    leases: LeaseManager
    node_key: str
    #: Waits until the scheduler has room (intake's back-pressure; the node's own rule).
    wait_for_room: Callable[[], Awaitable[None]]
    #: After a grant or a revoke: the embedded server's users follow the keyring.
    keyring_changed: Callable[[], Awaitable[None]]


def later_children(deps: LaterDeps) -> list[ChildSpec]:
    """The children's specs, in start order (each factory is called at every (re)start)."""
    cfg, store, bus, tasks, clock, authn = (deps.config, deps.store, deps.bus, deps.tasks,
                                            deps.clock, deps.authn)
    acceptor = Acceptor(store, deps.registry, clock, cfg.node_id, cfg.partitions,
                        has_room=deps.scheduler.has_room, wait_for_room=deps.wait_for_room,
                        limits=SubmitLimits(cfg.submit_rate, cfg.tenant_submit_rates,
                                            cfg.submit_burst, clock.monotonic),
                        routes=cfg.new_task_routes)
    keyring = KeyringHooks(changed=deps.keyring_changed, reserved=frozenset({deps.node_key}))
    return [
        ChildSpec("api", lambda _: ApiActor(bus, authn, acceptor, store), Restart.PERMANENT),
        ChildSpec("admin", lambda _: AdminActor(bus, authn, store, deps.system, clock,
                                                cfg.node_id, tasks, deps.switches,
                                                deps.leases, keyring),
                  Restart.PERMANENT),
        ChildSpec("timers", lambda _: TimerService(store, tasks, clock), Restart.PERMANENT),
        ChildSpec("schedules", lambda _: ScheduleService(store, tasks, acceptor, clock),
                  Restart.PERMANENT),
        ChildSpec("drift", lambda _: DriftService(store, deps.registry, tasks, clock,
                                                  cfg.node_id, cfg.partitions),
                  Restart.PERMANENT),
        ChildSpec("recovery", lambda _: RecoverySweeper(store, tasks, clock,
                                                        cfg.recovery_interval),
                  Restart.PERMANENT),
        ChildSpec("retention", lambda _: RetentionSweeper(store, clock, cfg.retention),
                  Restart.PERMANENT),
        ChildSpec("settle", lambda _: ActionSweeper(store, tasks, clock, cfg.settle_interval,
                                                    cfg.settle_after),
                  Restart.PERMANENT),
        ChildSpec("external", lambda _: ExternalRouter(bus, tasks, store, clock, authn),
                  Restart.PERMANENT),
        ChildSpec("decisions", lambda _: DecisionRouter(bus, tasks, store, clock, authn),
                  Restart.PERMANENT),
        ChildSpec("intake", lambda _: IntakeActor(bus, acceptor, authn,
                                                  rescan_interval=cfg.intake_rescan_interval),
                  Restart.PERMANENT),
    ]
