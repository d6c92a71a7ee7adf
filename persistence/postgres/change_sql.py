"""Migration 22 on PostgreSQL: a task change as one server-side function call, and the
WAL flush the writer's asynchronous commits wait for (docs/operations.md, "PostgreSQL").

``ratchet_apply_change`` does, in the one transaction of the statement that calls it (in
autocommit), what ``apply_change_txn`` (persistence/txns.py) does in a transaction of ~6
statements: the fencing check on the partition's lease row, the task row read ``FOR
UPDATE`` and its compare-and-set on ``version``, the inbox claim, the status transition,
the events with contiguous sequences and their outbox rows, the mail, the checkpoint with
its values and blobs, and the task row's update. Python still builds every byte: payloads,
the events' wire form (the sequence and version spliced in here by
:func:`ratchet_mp_uint`, which packs an unsigned integer exactly as msgpack-python does),
subjects, checkpoint values. A refusal is a distinct SQLSTATE that the caller
(persistence/postgres/change_call.py) maps to the exception the Python path raises:

========  =====================================================
``RT001``  fenced: the lease row's token or expiry (DETAIL: ``owner,token``)
``RT002``  no such task
``RT003``  version conflict (DETAIL: the task's version)
``RT004``  the inbox message was processed before
``RT005``  illegal transition (DETAIL: the task's status)
``RT006``  the caller's tenant or sandbox flag for the task is not the row's: fall back
========  =====================================================

``ratchet_flush`` makes every commit made before it durable: when the WAL is flushed as far
as it was written it does nothing (one read); else it writes one transactional logical
message (an xid, a commit record) so that its own synchronous commit flushes the WAL up to
there — past every earlier commit, since the WAL is one sequence.

``ratchet_accept`` is ``accept_submission_txn``: the request's key, the task row, its
``task.queued`` event and the start mail, in one call.

SQLite has no such functions: its migration 22 is empty (persistence/schema.py).
"""

from __future__ import annotations

__all__ = ["ACCEPT_SQL", "ACCEPT_TYPES", "APPLY_CHANGE_SQL", "APPLY_CHANGE_TYPES", "FLUSH_SQL",
           "PG_MIGRATION_22"]

#: msgpack's unsigned integer, as msgpack-python packs it (the smallest form). A PL/pgSQL
#: function, not SQL: called from PL/pgSQL, a SQL function is not inlined and costs an
#: executor start per call (~40 µs measured), where a PL/pgSQL one is a simple expression.
_MP_UINT = r"""
CREATE FUNCTION ratchet_mp_uint(n BIGINT) RETURNS BYTEA
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN CASE
        WHEN n < 128 THEN substring(int8send(n) FROM 8 FOR 1)
        WHEN n < 256 THEN '\xcc'::bytea || substring(int8send(n) FROM 8 FOR 1)
        WHEN n < 65536 THEN '\xcd'::bytea || substring(int8send(n) FROM 7 FOR 2)
        WHEN n < 4294967296 THEN '\xce'::bytea || substring(int8send(n) FROM 5 FOR 4)
        ELSE '\xcf'::bytea || int8send(n)
    END;
END
$$;
"""

_FLUSH = r"""
CREATE FUNCTION ratchet_flush() RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn() THEN
        RETURN FALSE;
    END IF;
    PERFORM pg_logical_emit_message(TRUE, 'ratchet.flush', '');
    RETURN TRUE;
END
$$;
"""

_APPLY = r"""
CREATE FUNCTION ratchet_apply_change(
    p_task_id TEXT, p_expected BIGINT, p_partition BIGINT, p_token BIGINT,
    p_lease_now DOUBLE PRECISION, p_tenant TEXT, p_sandbox BOOLEAN, p_now DOUBLE PRECISION,
    p_inbox TEXT, p_from TEXT[], p_to TEXT[],
    p_ev_types TEXT[], p_ev_ids TEXT[], p_ev_payloads BYTEA[], p_ev_heads BYTEA[],
    p_ev_mids BYTEA[], p_ev_tails BYTEA[], p_ev_subjects TEXT[], p_ev_headers BYTEA,
    p_mail_subjects TEXT[], p_mail_ids TEXT[], p_mail_payloads BYTEA[],
    p_cp_step_index BIGINT, p_cp_step_name TEXT, p_cp_next_step BIGINT, p_cp_next_node TEXT,
    p_cp_visits BYTEA, p_val_keys TEXT[], p_val_inline BYTEA[], p_val_blob TEXT[],
    p_val_deleted BIGINT[], p_blob_digests TEXT[], p_blob_sizes BIGINT[], p_blob_data BYTEA[],
    p_step_failed BOOLEAN, p_set_control BOOLEAN, p_control BYTEA, p_error BYTEA,
    p_output BYTEA, p_definition_hash TEXT,
    OUT o_version BIGINT, OUT o_status TEXT, OUT o_first_seq BIGINT,
    OUT o_checkpoint BIGINT, OUT o_outbox BIGINT[])
LANGUAGE plpgsql AS $$
DECLARE
    l_owner TEXT;
    l_token BIGINT;
    l_expires DOUBLE PRECISION;
    t RECORD;
    l_at INTEGER;
    l_id BIGINT;
    l_seq BIGINT;
    l_version BYTEA;
    l_wire BYTEA;
    l_events INTEGER := coalesce(array_length(p_ev_types, 1), 0);
BEGIN
    IF p_partition IS NOT NULL THEN
        -- Locked: a takeover (acquire_txn) locks it too before it bumps the token.
        SELECT owner, token, expires_at INTO l_owner, l_token, l_expires
            FROM leases WHERE partition = p_partition FOR UPDATE;
        IF NOT FOUND OR l_token <> p_token OR l_expires <= p_lease_now THEN
            RAISE EXCEPTION 'fenced' USING ERRCODE = 'RT001',
                DETAIL = coalesce(l_owner, '') || ',' || coalesce(l_token::text, '');
        END IF;
    END IF;
    SELECT tenant, status, version, last_event_seq, last_checkpoint,
           sandbox IS NOT NULL AS in_sandbox
        INTO t FROM tasks WHERE task_id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no such task' USING ERRCODE = 'RT002';
    END IF;
    IF t.tenant <> p_tenant OR t.in_sandbox <> p_sandbox THEN
        RAISE EXCEPTION 'task identity' USING ERRCODE = 'RT006';
    END IF;
    IF p_expected IS NOT NULL AND t.version <> p_expected THEN
        RAISE EXCEPTION 'version moved' USING ERRCODE = 'RT003', DETAIL = t.version::text;
    END IF;
    IF p_inbox IS NOT NULL THEN
        INSERT INTO inbox(message_id, task_id, processed_at) VALUES (p_inbox, p_task_id, p_now)
            ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'duplicate message' USING ERRCODE = 'RT004';
        END IF;
    END IF;
    o_status := t.status;
    IF p_from IS NOT NULL THEN
        l_at := array_position(p_from, t.status);
        IF l_at IS NULL THEN
            RAISE EXCEPTION 'illegal transition' USING ERRCODE = 'RT005', DETAIL = t.status;
        END IF;
        o_status := p_to[l_at];
    END IF;
    o_version := CASE WHEN p_expected IS NULL THEN t.version ELSE t.version + 1 END;
    o_first_seq := t.last_event_seq + 1;
    o_outbox := '{}';
    l_version := ratchet_mp_uint(o_version);
    FOR i IN 1 .. l_events LOOP
        l_seq := t.last_event_seq + i;
        l_wire := p_ev_heads[i] || ratchet_mp_uint(l_seq) || p_ev_mids[i] || l_version
            || p_ev_tails[i];
        INSERT INTO events(task_id, sequence, event_id, type, aggregate_version, occurred_at,
                           payload)
            VALUES (p_task_id, l_seq, p_ev_ids[i], p_ev_types[i], o_version, p_now,
                    p_ev_payloads[i]);
        INSERT INTO outbox(subject, msg_id, payload, headers, created_at)
            VALUES (p_ev_subjects[i], p_ev_ids[i], l_wire, p_ev_headers, p_now)
            RETURNING id INTO l_id;
        o_outbox := o_outbox || l_id;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(p_mail_subjects, 1), 0) LOOP
        INSERT INTO outbox(subject, msg_id, payload, headers, created_at)
            VALUES (p_mail_subjects[i], p_mail_ids[i], p_mail_payloads[i], NULL, p_now)
            RETURNING id INTO l_id;
        o_outbox := o_outbox || l_id;
    END LOOP;
    IF t.status IN ('UNKNOWN', 'WAITING_APPROVAL') AND o_status <> t.status THEN
        UPDATE handoffs SET resolved_at = p_now WHERE task_id = p_task_id
            AND resolved_at IS NULL;
    END IF;
    o_checkpoint := t.last_checkpoint;
    IF p_cp_step_index IS NOT NULL THEN
        o_checkpoint := t.last_checkpoint + 1;
        INSERT INTO checkpoints(task_id, seq, step_index, step_name, next_step, next_node,
                                created_at)
            VALUES (p_task_id, o_checkpoint, p_cp_step_index, p_cp_step_name,
                    p_cp_next_step, p_cp_next_node, p_now);
        IF p_blob_digests IS NOT NULL THEN
            INSERT INTO blobs(digest, size, data, created_at)
                SELECT d, s, x, p_now FROM unnest(p_blob_digests, p_blob_sizes, p_blob_data)
                    AS b(d, s, x)
                ON CONFLICT DO NOTHING;
        END IF;
        INSERT INTO checkpoint_values(task_id, key, seq, inline, blob, deleted)
            SELECT p_task_id, k, o_checkpoint, v, b, d
                FROM unnest(p_val_keys, p_val_inline, p_val_blob, p_val_deleted)
                    AS u(k, v, b, d);
    END IF;
    -- Unchanged columns keep their value: an indexed one (status) left equal keeps the
    -- update HOT.
    UPDATE tasks SET
        status = o_status,
        last_event_seq = t.last_event_seq + l_events,
        updated_at = p_now,
        version = o_version,
        last_checkpoint = o_checkpoint,
        next_step = CASE WHEN p_cp_step_index IS NULL THEN next_step ELSE p_cp_next_step END,
        step_failures = CASE WHEN p_cp_step_index IS NOT NULL THEN 0
                             WHEN p_step_failed THEN step_failures + 1
                             ELSE step_failures END,
        current_node = CASE WHEN p_cp_step_index IS NULL THEN current_node
                            ELSE p_cp_next_node END,
        visits = coalesce(p_cp_visits, visits),
        control = CASE WHEN p_set_control THEN p_control ELSE control END,
        error = coalesce(p_error, error),
        output = coalesce(p_output, output),
        definition_hash = coalesce(p_definition_hash, definition_hash)
        WHERE task_id = p_task_id AND version = t.version;
    IF NOT FOUND THEN  -- cannot happen under the row lock; kept as the CAS of record
        RAISE EXCEPTION 'version moved' USING ERRCODE = 'RT003', DETAIL = t.version::text;
    END IF;
END
$$;
"""

_ACCEPT = r"""
CREATE FUNCTION ratchet_accept(
    p_task_id TEXT, p_tenant TEXT, p_workflow TEXT, p_workflow_version BIGINT, p_key TEXT,
    p_hash TEXT, p_input BYTEA, p_steps_total BIGINT, p_deadline DOUBLE PRECISION,
    p_now DOUBLE PRECISION, p_message_id TEXT, p_budget BYTEA, p_traceparent TEXT,
    p_definition_hash TEXT, p_ev_type TEXT, p_ev_id TEXT, p_ev_payload BYTEA,
    p_ev_wire BYTEA, p_ev_subject TEXT, p_ev_headers BYTEA, p_mail_subject TEXT,
    p_mail_id TEXT, p_mail_payload BYTEA,
    OUT o_task_id TEXT, OUT o_status TEXT, OUT o_created BOOLEAN, OUT o_conflict BOOLEAN,
    OUT o_existing_hash TEXT, OUT o_outbox BIGINT[])
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
    l_id BIGINT;
BEGIN
    o_created := FALSE;
    o_conflict := FALSE;
    o_outbox := '{}';
    LOOP
        SELECT request_hash, task_id INTO r FROM requests
            WHERE tenant = p_tenant AND idempotency_key = p_key;
        IF FOUND THEN
            o_task_id := r.task_id;
            o_status := coalesce((SELECT status FROM tasks WHERE task_id = r.task_id),
                                 'UNKNOWN');
            IF r.request_hash <> p_hash THEN
                INSERT INTO request_conflicts(tenant, idempotency_key, request_hash,
                                              existing_hash, message_id, occurred_at)
                    VALUES (p_tenant, p_key, p_hash, r.request_hash, p_message_id, p_now);
                o_conflict := TRUE;
                o_existing_hash := r.request_hash;
            END IF;
            RETURN;
        END IF;
        -- Waits for another node's insert of the key in flight; none inserted: that one
        -- committed, and the read above, run again, sees it.
        INSERT INTO requests(tenant, idempotency_key, request_hash, task_id, created_at)
            VALUES (p_tenant, p_key, p_hash, p_task_id, p_now) ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
    END LOOP;
    INSERT INTO tasks(task_id, tenant, workflow, workflow_version, status, version,
                      idempotency_key, request_hash, input, steps_total, last_event_seq,
                      deadline_at, created_at, updated_at, budget, traceparent,
                      definition_hash)
        VALUES (p_task_id, p_tenant, p_workflow, p_workflow_version, 'QUEUED', 1, p_key,
                p_hash, p_input, p_steps_total, 1, p_deadline, p_now, p_now, p_budget,
                p_traceparent, p_definition_hash);
    INSERT INTO events(task_id, sequence, event_id, type, aggregate_version, occurred_at,
                       payload)
        VALUES (p_task_id, 1, p_ev_id, p_ev_type, 1, p_now, p_ev_payload);
    INSERT INTO outbox(subject, msg_id, payload, headers, created_at)
        VALUES (p_ev_subject, p_ev_id, p_ev_wire, p_ev_headers, p_now) RETURNING id INTO l_id;
    o_outbox := o_outbox || l_id;
    INSERT INTO outbox(subject, msg_id, payload, headers, created_at)
        VALUES (p_mail_subject, p_mail_id, p_mail_payload, NULL, p_now) RETURNING id INTO l_id;
    o_outbox := o_outbox || l_id;
    o_task_id := p_task_id;
    o_status := 'QUEUED';
    o_created := TRUE;
END
$$;
"""

#: The PostgreSQL text of migration 22 (one script: the bodies hold semicolons).
PG_MIGRATION_22 = _MP_UINT + _FLUSH + _APPLY + _ACCEPT

#: The function's argument types, in order (postgres/prepared.py encodes each by its type).
APPLY_CHANGE_TYPES = ("text int8 int8 int8 float8 text bool float8 text text[] text[]"
                      " text[] text[] bytea[] bytea[] bytea[] bytea[] text[] bytea"
                      " text[] text[] bytea[]"
                      " int8 text int8 text bytea text[] bytea[] text[] int8[] text[] int8[]"
                      " bytea[] bool bool bytea bytea bytea text").split()

#: The call, its arguments in the function's order (change_call.py builds them).
APPLY_CHANGE_SQL = ("SELECT * FROM ratchet_apply_change("
                    + ", ".join(f"${i}::{t}" for i, t in enumerate(APPLY_CHANGE_TYPES, 1))
                    + ")")

ACCEPT_TYPES = ("text text text int8 text text bytea int8 float8 float8 text bytea text text"
                " text text bytea bytea text bytea text text bytea").split()

#: A submission's acceptance, as ``accept_submission_txn`` (persistence/txns.py) makes it.
ACCEPT_SQL = ("SELECT * FROM ratchet_accept("
              + ", ".join(f"${i}::{t}" for i, t in enumerate(ACCEPT_TYPES, 1)) + ")")

FLUSH_SQL = "SELECT ratchet_flush()"
