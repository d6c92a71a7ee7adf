"""The schema: migrations (version, name, SQL), each run once (migrations.py). Append; never edit."""

from __future__ import annotations

from ratchet.persistence.branch_schema import BRANCH_PLACEMENT_DDL, BRANCH_STEPS_DDL, SESSION_DDL
from ratchet.persistence.drift_schema import RECONCILE_DDL
from ratchet.persistence.ops_schema import OPS_DDL
from ratchet.persistence.sandbox_schema import SANDBOX_DDL
from ratchet.persistence.schedule_schema import SCHEDULES_DDL
from ratchet.persistence.sweep_rows import UNSETTLED_DDL

__all__ = ["MIGRATIONS"]

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "tasks, requests, events, checkpoints, blobs, outbox, inbox, dead letters",
        """
        CREATE TABLE tasks (
            task_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            workflow TEXT NOT NULL,
            workflow_version INTEGER NOT NULL,
            status TEXT NOT NULL,
            version INTEGER NOT NULL,
            idempotency_key TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            input BLOB NOT NULL,
            next_step INTEGER NOT NULL DEFAULT 0,
            steps_total INTEGER,
            last_checkpoint INTEGER NOT NULL DEFAULT 0,
            last_event_seq INTEGER NOT NULL DEFAULT 0,
            error BLOB,
            output BLOB,
            deadline_at REAL,
            fork_of TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX tasks_by_status ON tasks(status) WHERE status NOT IN
            ('SUCCEEDED', 'FAILED', 'CANCELLED');
        CREATE INDEX tasks_by_tenant ON tasks(tenant, created_at);

        -- Request-level idempotency: the lasting guard (JetStream's dedup window is 2 min).
        CREATE TABLE requests (
            tenant TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            task_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (tenant, idempotency_key)
        ) WITHOUT ROWID;
        CREATE TABLE request_conflicts (
            id INTEGER PRIMARY KEY,
            tenant TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            existing_hash TEXT NOT NULL,
            message_id TEXT,
            occurred_at REAL NOT NULL
        );

        CREATE TABLE events (
            task_id TEXT NOT NULL,
            sequence INTEGER NOT NULL,
            event_id TEXT NOT NULL UNIQUE,
            type TEXT NOT NULL,
            aggregate_version INTEGER NOT NULL,
            occurred_at REAL NOT NULL,
            payload BLOB NOT NULL,
            PRIMARY KEY (task_id, sequence)
        ) WITHOUT ROWID;

        -- A checkpoint is a step boundary: its values are only the state keys that changed.
        CREATE TABLE checkpoints (
            task_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            step_index INTEGER NOT NULL,
            step_name TEXT NOT NULL,
            next_step INTEGER NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (task_id, seq)
        ) WITHOUT ROWID;
        CREATE TABLE checkpoint_values (
            task_id TEXT NOT NULL,
            key TEXT NOT NULL,
            seq INTEGER NOT NULL,
            inline BLOB,
            blob TEXT,
            deleted INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (task_id, key, seq)
        ) WITHOUT ROWID;
        CREATE TABLE blobs (
            digest TEXT PRIMARY KEY,
            size INTEGER NOT NULL,
            data BLOB NOT NULL,
            created_at REAL NOT NULL
        ) WITHOUT ROWID;

        CREATE TABLE outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            subject TEXT NOT NULL,
            msg_id TEXT NOT NULL,
            payload BLOB NOT NULL,
            headers BLOB,
            created_at REAL NOT NULL
        );

        -- Receivers drop duplicate actor mail by message id, in the effect's transaction.
        CREATE TABLE inbox (
            message_id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            processed_at REAL NOT NULL
        ) WITHOUT ROWID;

        CREATE TABLE dead_letters (
            id INTEGER PRIMARY KEY,
            subject TEXT NOT NULL,
            error_code TEXT NOT NULL,
            error_message TEXT NOT NULL,
            details BLOB,
            raw BLOB NOT NULL,
            received_at REAL NOT NULL
        );
        """,
    ),
    (
        2,
        "action ledger, tool sessions, durable timers, external waits, handoffs",
        """
        -- The side-effect ledger: one row per business action (tenant, idempotency key).
        CREATE TABLE actions (
            tenant TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            task_id TEXT NOT NULL,
            step_index INTEGER NOT NULL,
            tool TEXT NOT NULL,
            kind TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            args BLOB NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            accepted INTEGER NOT NULL DEFAULT 0,
            result BLOB,
            error BLOB,
            provider_id TEXT,
            compensates TEXT,
            seq INTEGER NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (tenant, idempotency_key)
        ) WITHOUT ROWID;
        CREATE INDEX actions_by_task ON actions(task_id, seq);

        CREATE TABLE tool_sessions (
            task_id TEXT NOT NULL,
            session TEXT NOT NULL,
            state BLOB NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (task_id, session)
        ) WITHOUT ROWID;

        -- Durable timers: read against the injected clock, fired as mail to the task.
        CREATE TABLE timers (
            timer_id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            due_at REAL NOT NULL,
            payload BLOB NOT NULL,
            fired_at REAL
        ) WITHOUT ROWID;
        CREATE INDEX timers_due ON timers(due_at) WHERE fired_at IS NULL;

        -- What a WAITING_EXTERNAL task waits for: a message with this correlation id.
        CREATE TABLE waits (
            tenant TEXT NOT NULL,
            correlation_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            created_at REAL NOT NULL,
            resolved_at REAL,
            PRIMARY KEY (tenant, correlation_id)
        ) WITHOUT ROWID;

        -- Packages handed to a human (UNKNOWN outcomes, failing compensations).
        CREATE TABLE handoffs (
            id INTEGER PRIMARY KEY,
            task_id TEXT NOT NULL,
            reason TEXT NOT NULL,
            package BLOB NOT NULL,
            created_at REAL NOT NULL,
            resolved_at REAL
        );
        CREATE INDEX handoffs_by_task ON handoffs(task_id);
        """,
    ),
    (
        3,
        "workflow graphs: current node, node visits, branches of fan-outs, approvals",
        """
        ALTER TABLE tasks ADD COLUMN current_node TEXT;
        ALTER TABLE tasks ADD COLUMN visits BLOB;
        ALTER TABLE checkpoints ADD COLUMN next_node TEXT;

        -- One row per branch of a fan-out: the join's completion set lives here.
        CREATE TABLE branches (
            task_id TEXT NOT NULL,
            node TEXT NOT NULL,
            branch TEXT NOT NULL,
            status TEXT NOT NULL,
            result BLOB,
            error BLOB,
            started_at REAL NOT NULL,
            finished_at REAL,
            PRIMARY KEY (task_id, node, branch)
        ) WITHOUT ROWID;

        -- Approvals: one-time ids bound to the hash of the request being approved.
        CREATE TABLE approvals (
            approval_id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            node TEXT NOT NULL,
            request BLOB NOT NULL,
            request_hash TEXT NOT NULL,
            approvers TEXT NOT NULL,
            status TEXT NOT NULL,
            decided_by TEXT,
            reason TEXT,
            expires_at REAL,
            created_at REAL NOT NULL,
            decided_at REAL
        ) WITHOUT ROWID;
        CREATE INDEX approvals_by_task ON approvals(task_id);
        """,
    ),
    (
        4,
        "budgets (limits set at submission, what the task has spent), agent conversations",
        """
        ALTER TABLE tasks ADD COLUMN budget BLOB;
        ALTER TABLE tasks ADD COLUMN spent BLOB;

        -- An agent node's conversation and turn records, appended in the turn's transaction:
        -- each turn writes only what it added, and a resumed agent reads them back.
        CREATE TABLE agent_log (
            task_id TEXT NOT NULL,
            node TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            body BLOB NOT NULL,
            PRIMARY KEY (task_id, node, seq)
        ) WITHOUT ROWID;
        """,
    ),
    (
        5,
        "durable retry delays: when a PENDING action may be called again",
        """
        ALTER TABLE actions ADD COLUMN next_attempt_at REAL;
        """,
    ),
    (
        6,
        "admin: audit log (hash chain) and command ids",
        """
        -- Every admin command lands here before it takes effect, then with its outcome.
        -- Each entry's hash covers the previous one: editing history breaks the chain.
        CREATE TABLE audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            tenant TEXT NOT NULL,
            at REAL NOT NULL,
            principal TEXT NOT NULL,
            verb TEXT NOT NULL,
            command_id TEXT NOT NULL,
            task_id TEXT,
            outcome TEXT NOT NULL,
            detail BLOB NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL
        );
        -- Repeating a command id returns the first answer.
        CREATE TABLE admin_commands (
            tenant TEXT NOT NULL,
            command_id TEXT NOT NULL,
            verb TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            reply BLOB,
            created_at REAL NOT NULL,
            PRIMARY KEY (tenant, command_id)
        ) WITHOUT ROWID;
        """,
    ),
    (
        7,
        "operator requests on a task (cancel, pause) recorded before they take effect",
        """
        ALTER TABLE tasks ADD COLUMN control BLOB;
        """,
    ),
    (
        8,
        "kill switches for incidents (disabled tools, frozen dispatch), persisted",
        """
        CREATE TABLE switches (
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            by TEXT NOT NULL,
            reason TEXT,
            at REAL NOT NULL,
            PRIMARY KEY (kind, name)
        ) WITHOUT ROWID;
        """,
    ),
    (
        9,
        "step failures per task, for retries that survive restarts",
        # A column of its own migration: migration 1 has landed, and a database created by it
        # must gain the column too.
        "ALTER TABLE tasks ADD COLUMN step_failures INTEGER NOT NULL DEFAULT 0;",
    ),
    (
        10,
        "partition leases with fencing tokens; the node registry",
        """
        CREATE TABLE leases (
            partition INTEGER PRIMARY KEY,
            owner TEXT,
            token INTEGER NOT NULL DEFAULT 0,
            expires_at REAL NOT NULL DEFAULT 0,
            acquired_at REAL,
            previous_owner TEXT
        );
        CREATE TABLE nodes (
            node_id TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            heartbeat_at REAL NOT NULL,
            started_at REAL NOT NULL,
            info BLOB
        ) WITHOUT ROWID;
        """,
    ),
    (
        11,
        "lease times on the store's clock (persistence/leases.py), not on nodes' wall clocks",
        # Expiries written before were wall-clock times: void them (tokens are kept; owners
        # renew or reclaim at once). ``lease_epoch``: the boot the lease times count from.
        """
        UPDATE leases SET expires_at = 0;
        ALTER TABLE nodes ADD COLUMN seen_at REAL NOT NULL DEFAULT 0;
        CREATE TABLE lease_epoch (
            id INTEGER PRIMARY KEY CHECK (id = 0),
            epoch TEXT NOT NULL
        );
        """,
    ),
    (
        12,
        "the keyring (docs/security.md) and secrets shared by the cluster's nodes",
        """
        CREATE TABLE principals (
            public_key TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            tenant TEXT NOT NULL,
            roles TEXT NOT NULL,
            expires_at REAL,
            created_at REAL NOT NULL,
            revoked_at REAL,
            granted_by TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE INDEX principals_by_name ON principals(tenant, name);
        CREATE TABLE cluster_secrets (
            name TEXT PRIMARY KEY,
            value BLOB NOT NULL
        ) WITHOUT ROWID;
        """,
    ),
    (
        13,
        "blobs over 1 MiB in chunks, written without copies of the whole (persistence/blobs.py)",
        """
        ALTER TABLE blobs ADD COLUMN chunks INTEGER NOT NULL DEFAULT 0;
        CREATE TABLE blob_chunks (digest TEXT NOT NULL, idx INTEGER NOT NULL,
                                  data BLOB NOT NULL, PRIMARY KEY (digest, idx));
        """,
    ),
    (14, "secret_keys: the keys this store's secrets are sealed under (protocol/secrets.py)",
     "CREATE TABLE secret_keys (key_id TEXT PRIMARY KEY, created_at REAL NOT NULL)"),
    (15, "schedules: one task of a workflow per tick (protocol/schedules.py)", SCHEDULES_DDL),
    (16, "reconcile passes: drift reconciliation per workflow and partition", RECONCILE_DDL),
    (17, "actions not settled, for the action sweeper (sweep_rows.py)", UNSETTLED_DDL),
    (18, "step heartbeats, diagnosis indexes, bounded dead letters with headers", OPS_DDL),
    (19, "tasks.traceparent: the trace a task's spans continue", "ALTER TABLE tasks ADD COLUMN traceparent TEXT"),  # W3C; NULL: untraced
    (20, "tasks.definition_hash: the workflow definition a task started on (definition.py)",
     "ALTER TABLE tasks ADD COLUMN definition_hash TEXT"),
    (21, "tasks.sandbox: a sandbox fork's marks (sandbox_rows.py)", SANDBOX_DDL),
    (22, "PostgreSQL only: a task change in one call (postgres/change_sql.py)", ""),
    (23, "a fan-out branch's progress: next node, state, steps, attempts", BRANCH_STEPS_DDL),
    (24, "where a branch runs: its partition, its initial state", BRANCH_PLACEMENT_DDL),
    (25, "tool_sessions.version: a session's state written as a change", SESSION_DDL),
]
