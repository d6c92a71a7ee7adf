"""The DDL of migration 23 (persistence/schema.py): a fan-out branch's progress, kept on its
``branches`` row so that a branch interrupted at step 7 of 10 resumes at step 8
(persistence/branch_rows.py writes and reads it; actors/task/branch_pool.py runs it)."""

from __future__ import annotations

__all__ = ["BRANCH_PLACEMENT_DDL", "BRANCH_STEPS_DDL", "SESSION_DDL"]

# next_node NULL: the branch has committed no step yet (it starts at its graph's start, from
# its initial state). state and visits: msgpack, secrets sealed, as of the step committed
# last. steps: the steps committed so far. attempts: the branch's failed runs retried so far
# (a fan-out's ``branch_retries``, an operator's ``retry-branch``). No index: the rows are
# read by their primary key's prefix (task, fan-out).
BRANCH_STEPS_DDL = """
ALTER TABLE branches ADD COLUMN next_node TEXT;
ALTER TABLE branches ADD COLUMN state BLOB;
ALTER TABLE branches ADD COLUMN visits BLOB;
ALTER TABLE branches ADD COLUMN steps INTEGER NOT NULL DEFAULT 0;
ALTER TABLE branches ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0
"""

# Migration 24: where a branch runs. ``partition``: the partition its branch id hashes to
# (protocol/subjects.py ``branch_partition``): the owner of that partition's lease runs it,
# and a node that takes the partition over finds its RUNNING branches by the partial index.
# ``input``: its initial state (msgpack, secrets sealed), so that any node can start it
# from the row alone; NULL on the rows of fan-outs started before it (their task's node
# runs them, as before).
BRANCH_PLACEMENT_DDL = """
ALTER TABLE branches ADD COLUMN partition INTEGER;
ALTER TABLE branches ADD COLUMN input BLOB;
CREATE INDEX branches_running_partition ON branches(partition) WHERE status = 'RUNNING'
"""

# Migration 25: a tool session's state version, since the branches placed on other nodes
# call the task's sessions there (persistence/session_rows.py writes a call's change under
# it). 0 on the rows written before it.
SESSION_DDL = "ALTER TABLE tool_sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0"
