"""Store ports: the interfaces the upper layers (actors/, supervisors/) use of the store.

The runtime depends on these protocols, not on a storage engine: each consumer is typed
with the narrowest port that covers its calls; only the composition root (supervisors/node/
node.py) names a concrete class. The SQLite :class:`~persistence.store.Store` implements
every port structurally; a PostgreSQL store (a later issue) will implement the same ports.

The ports, by concern:

- :class:`TaskStore` — task execution: tasks and their state, changes, submissions,
  events, the action ledger, tool sessions, timers, waits, handoffs, fan-out branches,
  approvals, agent logs, dead letters, appending to the audit log, and the fence a node
  sets on task writes.
- :class:`OutboxStore` — the transactional outbox the relay publishes and deletes.
- :class:`AdminStore` — the admin service and retention: forks, purge and expiry, kill
  switches, task lists, verifying the audit log, and admin command ids.
- :class:`LeaseStore` — partition leases with fencing tokens, and the node registry.
- Declared beside their rows (persistence/<name>_rows.py) for this module's size:
  schedules, drift passes, writes nobody settled (sweep), what waits for a human (settle),
  metrics, diagnosis and heartbeats, dead letters, tasks by workflow version.
- :class:`StorePort` — all of the above, plus lifecycle (``close``) and the commit and
  WAL figures a node reports.

Signatures are the SQLite store's, parameter for parameter (tests/test_store_ports.py
checks it). The records they speak in live beside the implementation for now:
:class:`TaskRecord`, :class:`LoadedState` and :class:`Fence` are re-exported from here so
that the upper layers never import the SQLite module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ratchet.persistence.admin_rows import AuditEntry
from ratchet.persistence.audit_check import AuditReport
from ratchet.persistence.branch_rows import BranchStore
from ratchet.persistence.dead_letter_rows import DeadLetterStore
from ratchet.persistence.diagnose_rows import DiagnoseStore
from ratchet.persistence.drift_rows import DriftStore
from ratchet.persistence.fork import ForkRequest
from ratchet.persistence.leases import LeaseRow, NodeRow
from ratchet.persistence.ledger import ActionRecord
from ratchet.persistence.metric_rows import MetricStore
from ratchet.persistence.records import Fence, LoadedState, TaskRecord
from ratchet.persistence.schedule_rows import ScheduleRow, ScheduleStore
from ratchet.persistence.session_rows import SessionStore
from ratchet.persistence.settle_rows import SettleStore
from ratchet.persistence.sweep_rows import SweepStore
from ratchet.persistence.txns import AcceptResult, ChangeResult, NewTask, OutboxRow, TaskChange
from ratchet.persistence.version_rows import VersionStore
from ratchet.persistence.wal import WalStats
from ratchet.persistence.writer import WriterStats
from ratchet.protocol.auth import Principal
from ratchet.protocol.messages import TaskSnapshot
from ratchet.protocol.secrets import Sealer

__all__ = [
    "AdminStore",
    "KeyringStore",
    "Fence",
    "LeaseStore",
    "LoadedState",
    "OutboxListener", "OutboxStore",
    "ScheduleRow",
    "ScheduleStore", "DriftStore", "SweepStore", "SettleStore", "MetricStore", "DiagnoseStore",
    "DeadLetterStore", "VersionStore", "BranchStore",
    "StorePort",
    "TaskRecord",
    "TaskStore",
]

#: Called on the loop with the outbox rows of every commit that made some.
OutboxListener = Callable[[list[OutboxRow]], None]


@runtime_checkable
class TaskStore(BranchStore, SessionStore, Protocol):
    """What task execution needs: the task actor and its helpers (actions, sagas, fan-out
    branches and joins, tool sessions), and the services that feed tasks (intake, the
    request API, mail/decision/confirmation routers, timers, recovery, partition work)."""

    #: Set by a node: task-execution writes then carry its fencing token, and a write
    #: whose token is no longer the partition's current one is refused (``Fenced``).
    #: None: a store used without leases (tools, tests) checks nothing.
    fence: Fence | None
    #: Seals the secrets of what task execution stores (inputs, state values, ledger
    #: arguments and results, tool sessions) and opens them as it reads them back.
    secrets: Sealer

    # -- tasks and their state ---------------------------------------------------------

    async def load_task(self, task_id: str) -> TaskRecord:
        """The task's row; raises ``NotFound``."""
        ...

    async def snapshot(self, tenant: str, task_id: str) -> TaskSnapshot:
        """The task as ``status`` shows it. A task of another tenant is NOT_FOUND."""
        ...

    async def load_state(self, task_id: str, checkpoint: int | None = None) -> LoadedState:
        """The state at ``checkpoint`` (default: the latest)."""
        ...

    async def active_tasks(self) -> list[tuple[str, str, str]]:
        """(task_id, tenant, status) of every task not in a terminal state."""
        ...

    async def checkpoint_names(self, task_id: str) -> list[str]:
        """The names of the nodes completed, in checkpoint order."""
        ...

    # -- writes ------------------------------------------------------------------------

    async def accept_submission(self, task: NewTask) -> AcceptResult:
        """Record a submission (idempotent per tenant and key) with its start mail."""
        ...

    async def apply(self, change: TaskChange) -> ChangeResult:
        """Apply one task change atomically (compare-and-set on the task version)."""
        ...

    async def record_dead_letter(
        self, *, subject: str, raw: bytes, error: dict[str, Any], dlq_subject: str, now: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        ...

    # -- events ------------------------------------------------------------------------

    async def events(self, task_id: str, after: int = 0) -> list[dict[str, Any]]:
        ...

    async def recent_events(self, task_id: str, types: tuple[str, ...],
                            since: float) -> list[dict[str, Any]]:
        """The task's events of ``types`` that occurred at or after ``since``."""
        ...

    # -- action ledger and tool sessions -------------------------------------------------

    async def get_action(self, tenant: str, key: str) -> ActionRecord | None:
        ...

    async def task_actions(self, task_id: str) -> list[ActionRecord]:
        """The task's actions in the order they were first recorded."""
        ...

    # -- timers, waits, handoffs -------------------------------------------------------

    async def next_timer_due(self) -> float | None:
        ...

    async def due_timers(self, now: float, limit: int = 500) -> list[dict[str, Any]]:
        ...

    async def timer_fired(self, timer_id: str) -> bool:
        ...

    async def timer_payload(self, timer_id: str) -> dict[str, Any] | None:
        """The payload of a timer, armed or fired; None when there is no such row."""
        ...

    async def mark_timers_fired(self, fired: list[tuple[str, float]], now: float) -> None:
        """Mark ``(timer_id, due_at)`` pairs fired (a timer re-armed meanwhile stays armed)."""
        ...

    async def find_wait(self, tenant: str, correlation_id: str) -> tuple[str, str] | None:
        """(task_id, kind) of an open wait, or None."""
        ...

    async def handoffs(self, task_id: str) -> list[dict[str, Any]]:
        ...

    # -- graphs: branches, approvals, agent logs ---------------------------------------

    # (branches: BranchStore, persistence/branch_rows.py)

    async def approval(self, approval_id: str) -> dict[str, Any] | None:
        ...

    async def task_approvals(self, task_id: str) -> list[dict[str, Any]]:
        """Every approval the task asked for, oldest first (persistence/settle_rows.py)."""
        ...

    async def agent_log(self, task_id: str, node: str) -> list[tuple[str, dict[str, Any]]]:
        """An agent node's log entries ``(kind, body)`` in order."""
        ...

    # -- the audit log -----------------------------------------------------------------

    async def audit(self, entry: AuditEntry) -> int:
        """Append one audit entry to the tamper-evident chain and move its head (an
        implementation keys each entry with a secret it does not store beside the rows,
        and keeps the head outside them: persistence/audit_seal.py); returns its sequence
        number. Tasks record the approval decisions they refuse here (the ones they apply
        go in the decision's own change, ``TaskChange.audit``)."""
        ...


@runtime_checkable
class OutboxStore(Protocol):
    """What the outbox relay needs: rows committed for publication, announced right after
    their commit and read back (after a restart, or when an announcement was missed)."""

    async def pending_outbox(self, limit: int = 1000, after_id: int = 0) -> list[OutboxRow]:
        ...

    async def delete_outbox(self, ids: list[int]) -> None:
        ...

    def add_outbox_listener(self, listener: OutboxListener) -> None:
        """Called on the loop with the outbox rows of every commit that made some."""
        ...

    def remove_outbox_listener(self, listener: OutboxListener) -> None:
        ...

    def add_outbox_resync(self, callback: Callable[[], None]) -> None:
        """``callback()`` on the loop when rows may have committed unannounced."""
        ...


@runtime_checkable
class AdminStore(Protocol):
    """What the admin service and the retention sweeper need beyond task execution."""

    async def fork(self, request: ForkRequest) -> dict[str, Any]:
        """Create a fork; its start mail goes out via the outbox."""
        ...

    async def purge_task(self, task_id: str) -> dict[str, int]:
        """Remove a finished task's rows (the action ledger is kept); rows removed."""
        ...

    async def expired_tasks(self, tenant: str | None, finished_before: float,
                            limit: int = 500, exclude: list[str] | None = None) -> list[str]:
        """Finished tasks (of ``tenant``, or any) last updated before ``finished_before``."""
        ...

    async def switches(self) -> list[tuple[str, str, str]]:
        """Every kill switch that is on: ``(scope, kind, name)``; the scope is a tenant,
        or ``_system`` for every tenant."""
        ...

    async def set_switch(self, scope: str, kind: str, name: str, on: bool, by: str,
                         reason: str | None, now: float) -> None:
        ...

    async def list_tasks(self, tenant: str, *, status: str | None = None,
                         workflow: str | None = None, limit: int = 100,
                         cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """A page of the tenant's tasks, newest first; returns (rows, next cursor)."""
        ...

    async def model_calls(self, tenant: str, limit: int) -> list[ActionRecord]:
        """The tenant's ``limit`` most recent agent model calls (ledger rows)."""
        ...

    async def verify_audit(self, page: int = 2000) -> AuditReport:
        """Check the whole audit chain against the store's seal and head
        (persistence/audit_check.py); ``page`` rows are read at a time."""
        ...

    async def claim_command(self, tenant: str, command_id: str, verb: str, request_hash: str,
                            now: float) -> tuple[str, Any]:
        """``("new", None)``, ``("repeat", stored reply or None)`` or ``("conflict", None)``."""
        ...

    async def release_command(self, tenant: str, command_id: str) -> None:
        ...

    async def store_command_reply(self, tenant: str, command_id: str,
                                  reply: dict[str, Any]) -> None:
        ...


@runtime_checkable
class LeaseStore(Protocol):
    """What the lease manager and the cluster verbs need: partition leases (the token only
    ever increases) and the node registry.

    Lease expiry and node liveness are judged on the **store's** time, which the store
    reads itself inside each transaction (SQLite: the host's boot time; PostgreSQL: the
    server's ``clock_timestamp()``): no caller passes a time for them, so no node's wall
    clock decides whether another node's lease ran out. Rows read carry ``ttl_left`` and
    ``age``, relative to the store's time at the read."""

    async def ensure_partitions(self, partitions: int) -> None:
        """Create the lease rows once; refuse another partition count."""
        ...

    async def acquire_lease(self, partition: int, node: str, ttl: float,
                            reclaim: bool = False) -> LeaseRow | None:
        """Take the partition if it is free or its lease expired; the new row, or None."""
        ...

    async def renew_leases(self, node: str, held: dict[int, int], ttl: float) -> list[int]:
        """Extend every lease in ``held`` (partition → token) still ours; the ones lost."""
        ...

    async def release_leases(self, node: str, held: dict[int, int]) -> None:
        ...

    async def node_heartbeat(self, node: str, now: float, info: dict[str, Any],
                             starting: bool = False) -> str:
        """Record the node as alive (``now``: its wall clock, for people; its liveness is
        the store's time); returns its status (an operator may drain it)."""
        ...

    async def set_node_status(self, node: str, status: str) -> bool:
        ...

    async def leases(self) -> list[LeaseRow]:
        ...

    async def lease(self, partition: int) -> LeaseRow | None:
        ...

    async def nodes(self) -> list[NodeRow]:
        ...


@runtime_checkable
class KeyringStore(Protocol):
    """The keyring (docs/security.md): public keys → principals, changed only with an
    audit entry in the same transaction; and secrets the cluster's nodes share."""

    async def principals(self) -> list[Principal]:
        """Every key not revoked (expired ones too: callers check expiry)."""
        ...

    async def grant_principal(self, who: Principal, at: float, audit: AuditEntry) -> bool:
        """Add or change a key; False (and no audit entry) if it is granted exactly so."""
        ...

    async def revoke_principal(self, tenant: str, name: str, at: float,
                               audit: AuditEntry) -> int:
        """Revoke every key of the name; how many were live."""
        ...

    async def cluster_secret(self, name: str) -> bytes:
        """A random 32-byte secret shared by every node of this store (created once)."""
        ...

    async def claim_audit_key(self) -> bool:
        """Refuse (AUDIT_KEY_MISMATCH) an audit key not the chain's; record the first."""
        ...


@runtime_checkable
class StorePort(TaskStore, OutboxStore, AdminStore, LeaseStore, KeyringStore, ScheduleStore,
                DriftStore, SweepStore, SettleStore, MetricStore, DiagnoseStore,
                DeadLetterStore, VersionStore, Protocol):
    """The whole store, as the node that opened it holds it (and the admin service, which
    spans tasks, administration and leases)."""

    async def close(self) -> None:
        """Idempotent."""
        ...

    async def use_secrets(self, sealer: Sealer) -> None:
        """Seal and open secrets with ``sealer``; the first key is recorded, another refused
        (``SecretUnreadable``)."""
        ...

    async def secret_key_ids(self) -> list[str]:
        """The keys the store's secrets are sealed under (none before its first key)."""
        ...

    @property
    def writer_stats(self) -> WriterStats:
        """Group-commit figures (batches, transactions, commit durations)."""
        ...

    @property
    def wal_stats(self) -> WalStats:
        """The write-ahead log's size, peak, checkpoints and writer holds."""
        ...

    @property
    def file_lost(self) -> str | None:
        """Why the database file is no longer at its path, once noticed (every write is
        refused from then on; persistence/file_watch.py)."""
        ...

    @property
    def rescued_to(self) -> str | None:
        """Where the data of a lost database file went when the store closed."""
        ...

    def on_file_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` on the event loop when the database file is lost."""
        ...
