"""The Store (SQLite, WAL, group commit), checkpoints with blob dedup, migrations, and the
ports (``ports``): the store interfaces the upper layers depend on, which SQLite implements."""

from ratchet.persistence.checkpoints import BLOB_THRESHOLD, StateDelta, StateTracker
from ratchet.persistence.ports import (
    AdminStore,
    KeyringStore,
    LeaseStore,
    OutboxStore,
    StorePort,
    TaskStore,
)
from ratchet.persistence.store import LoadedState, Store, TaskRecord
from ratchet.persistence.txns import (
    AcceptResult,
    ChangeResult,
    CheckpointWrite,
    NewTask,
    OutboxRow,
    TaskChange,
)

__all__ = [
    "AdminStore",
    "KeyringStore",
    "LeaseStore",
    "OutboxStore",
    "StorePort",
    "TaskStore",
    "BLOB_THRESHOLD",
    "StateDelta",
    "StateTracker",
    "LoadedState",
    "Store",
    "TaskRecord",
    "AcceptResult",
    "ChangeResult",
    "CheckpointWrite",
    "NewTask",
    "OutboxRow",
    "TaskChange",
]
