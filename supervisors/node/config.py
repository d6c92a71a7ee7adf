"""A node's configuration: identity, state directory, NATS, store durability and limits,
task supervision, admission, leases, streams. Every field has a default fit for one node
on one machine; ``ratchet serve``'s flags set them (supervisors/cli/).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from ratchet.actors.effects.risk_policy import ToolRisk
from ratchet.actors.transport.bus import MB, StreamLimits
from ratchet.persistence.dead_letter_rows import DeadLetterLimits
from ratchet.protocol.auth import redact_url
from ratchet.protocol.subjects import DEFAULT_PARTITIONS

__all__ = ["NodeConfig"]


def _default_node_id() -> str:
    # Stable across restarts, so a restarted node takes its own leases back at once instead
    # of waiting for them to expire. Give each node of a cluster its own (--node-id).
    return f"node-{socket.gethostname()}"


@dataclass
class NodeConfig:
    """Args:
        state_dir: where the SQLite file (and the embedded server's data) live.
        nats_url: join this NATS instead of starting the embedded server: one URL, or a
            cluster's, comma-separated (actors/transport/servers.py).
        nats_creds: the node's credentials for ``nats_url`` (an nkey seed or a ``.creds``
            file; supervisors/node/nats_auth.py). The embedded server needs none: the node
            uses its own ``keys/node.nk``.
        synchronous: SQLite ``FULL`` (default: durable at each commit) or ``NORMAL`` (an
            OS crash may lose the last commits) — see docs/operations.md, "Durability".
        store: a ``postgresql://`` URL: the store is that PostgreSQL database (None: the
            SQLite file in ``state_dir``; docs/operations.md, "PostgreSQL").
        nats_port: the embedded server's port (None: the one kept for the state dir, else
            a free one, kept: supervisors/node/embedded_nats.py).
        nats_connect_timeout: seconds the first connection to NATS may take before the
            start is refused (``StartRefused``, NATS_UNREACHABLE).
        nats_replicas: copies JetStream keeps of each of Ratchet's streams (3 on a
            three-server cluster; at most its size, else the start is a usage error).
        audit_key_file: the audit chain's key (supervisors/node/audit_key.py), shared by
            the nodes on several machines; ``RATCHET_AUDIT_KEY`` wins; None and no variable:
            ``<state_dir>/keys/audit.key``.
    """

    state_dir: Path
    nats_url: str | None = None
    nats_creds: Path | None = None
    nats_port: int | None = None
    nats_connect_timeout: float = 10.0
    nats_replicas: int = 1
    partitions: int = DEFAULT_PARTITIONS
    synchronous: str = "FULL"
    store: str | None = None
    audit_key_file: Path | None = None
    node_id: str = field(default_factory=_default_node_id)
    task_max_restarts: int = 3
    task_restart_period: float = 60.0
    task_backoff_base: float = 0.05
    task_backoff_cap: float = 5.0
    max_step_attempts: int = 3
    #: tenant → seconds to keep finished tasks (``"*"``: every other tenant); empty: forever
    retention: dict[str, float] = field(default_factory=dict)
    #: A clean stop's drain (tasks to their safe points, the outbox, the leases): at most
    #: this many seconds, then what is left is cancelled (its tasks resume from checkpoints).
    drain_timeout: float = 30.0
    #: Partition leases: seconds a lease lasts unrenewed, seconds between heartbeats.
    lease_ttl: float = 5.0
    lease_interval: float = 1.0
    #: Wall-clock steps (protocol/clock_guard.py): a jump of the wall clock against the
    #: steady clock larger than this many seconds is a step (logged, counted, shown by
    #: ``ratchet admin nodes``); a forward one holds the timers and deadlines it alone made
    #: due until the clock has gone this many seconds without a step, or ``clock-ack``.
    clock_step_threshold: float = 5.0
    clock_step_hold: float = 600.0
    #: Fair admission: tasks running at once on this node; per-tenant caps and weights.
    max_running: int = 64
    #: Tasks queued for a running slot before intake pushes back (waits / answers BUSY).
    max_queued: int = 20_000
    tenant_quotas: dict[str, int] = field(default_factory=dict)
    tenant_weights: dict[str, float] = field(default_factory=dict)
    #: Tenants' tightening of tool risk tiers: tenant → tool → ToolRisk (``"*"``: every
    #: tenant, every write; actors/effects/risk_policy.py). Give every node the same.
    risk_policy: dict[str, dict[str, ToolRisk]] = field(default_factory=dict)
    #: Submit rate limits at intake, per tenant and per node (submissions a second; None:
    #: none), per-tenant overrides and the burst (None: one second's worth): past them a
    #: submission is refused RATE_LIMITED (supervisors/services/rate_limits.py).
    submit_rate: float | None = None
    tenant_submit_rates: dict[str, float] = field(default_factory=dict)
    submit_burst: int | None = None
    #: OpenTelemetry traces (``serve --otel``; the ``OTEL_*`` variables turn them on too):
    #: read by ``ratchet serve``, which owns the process's tracer (supervisors/node/otel.py).
    otel: bool = False
    #: Crash-loop guard: more than this many recoveries of a task within the window hand it
    #: to a human instead of recovering it again.
    max_recoveries: int = 3
    recovery_window: float = 600.0
    #: Seconds between the recovery sweeper's looks for unfinished tasks with no actor
    #: (their mail lost with JetStream: supervisors/services/recovery.py).
    recovery_interval: float = 30.0
    #: Seconds between the intake's scans of the submit stream for tenants with messages
    #: and no consumer loop: a backstop, a new tenant's first submit is seen as it comes
    #: (supervisors/services/intake.py).
    intake_rescan_interval: float = 5.0
    #: At most one ``task.progress`` event per task per this many seconds.
    progress_interval: float = 5.0
    #: How long a cancel waits for a write in flight before it detaches the call.
    cancel_timeout: float = 30.0
    #: The action sweeper (supervisors/services/action_sweeper.py): every ``settle_interval``
    #: seconds it settles writes left IN_FLIGHT/UNKNOWN for ``settle_after`` seconds by
    #: tasks with no live actor (a cancel's detached calls, mostly).
    settle_interval: float = 60.0
    settle_after: float = 300.0
    #: ``loop``/``thread``/``auto`` (= loop; with FULL the WAL is synced on a thread of
    #: its own, persistence/syncer.py): where commits run.
    #: Several nodes on one file wait on each other's write lock: ``thread`` keeps that
    #: wait off the event loop.
    writer: str = "auto"
    #: The SQLite WAL's bound: at this size writes hold while it is reset (persistence/wal.py).
    wal_limit_mb: float = 32.0
    #: JetStream: what the events, dead-letter and work-queue streams may hold (actors/transport/bus.py).
    streams: StreamLimits = field(default_factory=StreamLimits)
    #: What the store's dead_letters table keeps (persistence/dead_letter_rows.py).
    dead_letters: DeadLetterLimits = field(default_factory=DeadLetterLimits)
    #: A task's state: one value's encoding, and the values one checkpoint writes, at most
    #: this many MiB (persistence/checkpoints.py); a step over either fails for good.
    max_value_mb: float = 16.0
    max_checkpoint_mb: float = 64.0
    #: The web console (supervisors/console/): its port (None: off; 0: a free one) and
    #: address (loopback by default: expose it deliberately, docs/security.md).
    console_port: int | None = None
    console_host: str = "127.0.0.1"
    #: ``serve --metrics-port``: the port of /metrics, /healthz and /readyz (0: none), and
    #: the address it binds (supervisors/observability/).
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    #: ``serve`` exits (NOT_READY) when the node is not ready this many seconds after it
    #: began to start (supervisors/observability/health.py says what ready means).
    ready_timeout: float = 60.0
    #: ``serve --route-new-tasks``: workflow → (version, percent): that share of its new
    #: tasks that name no version go to that version (supervisors/services/canary.py).
    new_task_routes: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def db_path(self) -> Path:
        return Path(self.state_dir) / "ratchet.db"

    @property
    def store_name(self) -> str:
        """Where the store is, for logs and the serving line (a URL's password hidden)."""
        return redact_url(self.store) or str(self.db_path)

    @property
    def max_value_bytes(self) -> int:
        return int(self.max_value_mb * MB)

    @property
    def max_checkpoint_bytes(self) -> int:
        return int(self.max_checkpoint_mb * MB)
