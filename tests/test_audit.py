"""The audit chain is tamper-evident: edits, deleted entries (in the middle or the newest)
and a chain recomputed without the key are caught by ``verify-audit`` and at a node's
start, against a key and a head kept outside the database; and the chain covers
decisions, handoff resolutions and credential changes as well as admin commands.

The attacker here can write the SQLite file (``sqlite3`` on it while the node is down),
not the state directory's key."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

import ratchet
from ratchet.actors.task.actor import DeliverMail
from ratchet.actors.transport.subscribed import subscriptions_registered
from ratchet.persistence.admin_rows import (
    GENESIS,
    AuditEntry,
    credential_entry,
    entry_fields,
    entry_hash,
)
from ratchet.persistence.audit_check import AUDIT_COLUMNS, AuditReport
from ratchet.persistence.audit_seal import KEYED_PREFIX, AuditSeal
from ratchet.persistence.store import Store
from ratchet.protocol.codec import canonical, encode
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import decision_subject, dlq_subject
from tests.apps import three
from tests.conftest import RATCHET_BIN, ROOT, NodeFactory, sqlite_only, wait_terminal
from tests.graph_apps import approve
from tests.keys import client_as
from tests.test_admin import APPROVER, admin
from tests.test_graph_flows import DONE, PARKED, run_until

OPERATOR = {"name": "olga", "roles": ["operator"]}

# -- what the attacker does to the database file ------------------------------------------


def _edit_detail(db: sqlite3.Connection) -> None:
    db.execute("UPDATE audit SET detail = ? WHERE seq = 3",
               (msgpack.packb({"args": {"reason": "nothing to see"}}),))


def _delete_middle(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM audit WHERE seq = 3")


def _delete_newest(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM audit WHERE seq > 4")


def _rechain(db: sqlite3.Connection, digest: Callable[[int, str, AuditEntry], str]) -> None:
    """Rewrite every entry's links and hashes with ``digest`` after editing entry 2."""
    db.execute("UPDATE audit SET principal = 'mallory' WHERE seq = 2")
    prev = GENESIS
    for row in db.execute(f"SELECT {AUDIT_COLUMNS} FROM audit ORDER BY seq").fetchall():
        entry = AuditEntry(*row[1:8], msgpack.unpackb(row[8]))
        prev_of, prev = prev, digest(row[0], prev, entry)
        db.execute("UPDATE audit SET prev_hash = ?, hash = ? WHERE seq = ?",
                   (prev_of, prev, row[0]))


def _recompute_plain(db: sqlite3.Connection) -> None:
    _rechain(db, lambda seq, prev, e: entry_hash(prev, e))


def _recompute_with_own_key(db: sqlite3.Connection) -> None:
    key = b"mallory's key".ljust(32, b"!")

    def mac(seq: int, prev: str, e: AuditEntry) -> str:
        data = canonical(["audit-entry", seq, *entry_fields(prev, e)])
        return KEYED_PREFIX + hmac.new(key, data, hashlib.sha256).hexdigest()

    _rechain(db, mac)


def _tamper(path: Path, how: Callable[[sqlite3.Connection], None]) -> None:
    db = sqlite3.connect(path)
    try:
        how(db)
        db.commit()
    finally:
        db.close()


#: tamper → the sequence number the first problem names, for a chain of 8 entries.
TAMPERING: dict[str, tuple[Callable[[sqlite3.Connection], None], int]] = {
    "edit": (_edit_detail, 3),
    "delete-middle": (_delete_middle, 4),
    "delete-newest": (_delete_newest, 5),
    "recompute-plain": (_recompute_plain, 1),
}

# -- on a store with its seal ---------------------------------------------------------------


@pytest.fixture
async def sealed(tmp_path: Path) -> AsyncIterator[tuple[Store, Path]]:
    state = tmp_path / "state"
    store = await Store.open(state / "ratchet.db", audit_seal=AuditSeal.open(state))
    yield store, state
    await store.close()


async def _write(store: Store, n: int, first: int = 1) -> None:
    for i in range(first, first + n):
        await store.audit(AuditEntry("acme", float(i), "olga", "cancel", f"c{i}", "tsk_1",
                                     "requested" if i % 2 else "ok", {"args": {"i": i}}))


async def _reopened(path: Path, state: Path) -> AuditReport:
    store = await Store.open(path, audit_seal=AuditSeal.open(state))
    try:
        return await store.verify_audit()
    finally:
        await store.close()


def _seqs(report: AuditReport) -> list[int]:
    return [p["seq"] for p in report.problems]


async def test_a_sealed_chain_verifies_with_its_key_and_head_outside_the_database(
    sealed: tuple[Store, Path]
) -> None:
    store, state = sealed
    await _write(store, 5)
    for verb in ("bootstrap", "grant", "revoke"):
        await store.audit(credential_entry("_system", 9.0, "root", verb, f"k-{verb}",
                                           {"name": "olga", "roles": ["operator"]}))
    report = await store.verify_audit(page=3)  # pages end mid-chain: the check goes on
    assert report.to_wire() == {"ok": True, "entries": 8, "head_seq": 8, "problems": [],
                                "more_problems": 0}
    key, head = state / "keys" / "audit.key", state / "audit.head"
    assert stat.S_IMODE(key.stat().st_mode) == stat.S_IMODE(head.stat().st_mode) == 0o600
    assert json.loads(head.read_text())["seq"] == 8
    assert key.read_text().strip() not in (state / "ratchet.db").read_bytes().decode("latin-1")
    log = await store.audit_log()
    assert [e["verb"] for e in log[-3:]] == ["bootstrap", "grant", "revoke"]
    assert all(e["hash"].startswith(KEYED_PREFIX) for e in log)
    with pytest.raises(ValueError, match="not a credential verb"):
        credential_entry("acme", 1.0, "root", "cancel", "x", {})


@pytest.mark.parametrize("name", [*TAMPERING, "recompute-own-key"])
async def test_each_kind_of_tampering_is_caught_where_it_happened(
    sealed: tuple[Store, Path], name: str
) -> None:
    store, state = sealed
    await _write(store, 8)
    await store.close()
    how, first = TAMPERING.get(name, (_recompute_with_own_key, 1))
    _tamper(Path(store.path), how)
    report = await _reopened(Path(store.path), state)
    assert not report.ok and _seqs(report)[0] == first, report
    if name.startswith("recompute"):  # every rewritten entry, and the head's
        assert _seqs(report) == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    if name == "delete-newest":
        assert report.problems == [{"seq": 5, "problem": "entries 5..8 are missing: the head"
                                    " names them (the newest entries were deleted)"}]


async def test_entries_after_a_truncation_leave_the_gap_for_good(
    sealed: tuple[Store, Path]
) -> None:
    store, state = sealed
    await _write(store, 8)
    await store.close()
    _tamper(Path(store.path), _delete_newest)
    again = await Store.open(store.path, audit_seal=AuditSeal.open(state))
    try:
        await _write(again, 6, first=9)  # more than were deleted: the head moves on
        report = await again.verify_audit()
    finally:
        await again.close()
    assert report.head_seq == 14 and report.entries == 10
    assert report.problems[0] == {"seq": 9, "problem": "entries 5..8 are missing (deleted)"}


async def test_entries_appended_after_the_head_verify_and_a_removed_head_is_caught(
    sealed: tuple[Store, Path]
) -> None:
    store, state = sealed
    await _write(store, 4)
    head = state / "audit.head"
    old_head = head.read_text()
    # Another node of the store appends; this node's view of the head is still the old one
    # (as after a crash between an entry's commit and the head's replace).
    other = await Store.open(store.path, audit_seal=AuditSeal.open(state))
    try:
        await _write(other, 2, first=5)
    finally:
        await other.close()
    head.write_text(old_head)
    report = await store.verify_audit()
    assert report.ok and report.entries == 6 and report.head_seq == 4
    # A forged head (a later sequence number without the key's MAC) is caught ...
    forged = json.loads(old_head) | {"seq": 6}
    head.write_text(json.dumps(forged))
    assert "does not carry this key's MAC" in (await store.verify_audit()).problems[0]["problem"]
    # ... and so is a removed one, which no later write puts back silently.
    head.unlink()
    await _write(store, 1, first=7)
    report = await store.verify_audit()
    assert not head.exists()
    assert report.problems == [{"seq": 0, "problem": f"the head file {head} is missing"}]


async def test_entries_written_before_the_seal_are_anchored_by_its_first_head(
    tmp_path: Path
) -> None:
    state = tmp_path / "state"
    path = state / "ratchet.db"
    unsealed = await Store.open(path)  # as before this change: plain sha256 entries
    await _write(unsealed, 3)
    await unsealed.close()
    sealed = await Store.open(path, audit_seal=AuditSeal.open(state))
    try:
        await _write(sealed, 2, first=4)
        assert (await sealed.verify_audit()).ok
        assert json.loads((state / "audit.head").read_text())["keyed_from"] == 4
    finally:
        await sealed.close()
    _tamper(path, _recompute_plain)  # the old entries can be recomputed: the head shows it
    report = await _reopened(path, state)
    assert _seqs(report) == [4, 5, 5]


# -- on a node: what it covers, the start check, the verb and the CLI ---------------------


async def _cli_verify(nats_url: str, state: Path) -> tuple[int, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", "admin",
        "verify-audit", "--nats-url", nats_url, cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return int(proc.returncode or 0), json.loads(out)


async def _decide(client: ratchet.Client, task_id: str, approval_id: str, decision: str,
                  tenant: str = "acme", message_id: str | None = None) -> None:
    env = Envelope(type="approval.decision", message_id=message_id or f"d-{approval_id}",
                   correlation_id=approval_id,
                   body={"task_id": task_id, "approval_id": approval_id, "decision": decision,
                         "decided_by": "dana", "reason": "checked"})
    await client.publish_signed(decision_subject(tenant), encode(env))


async def _approval(client: ratchet.Client, amount: int, key: str) -> tuple[str, dict[str, Any]]:
    task_id = (await client.submit("approve", {"amount": amount}, key=key)).task_id
    events = await run_until(client, task_id, PARKED)
    return task_id, events[-1].payload


async def test_decisions_handoff_resolutions_and_credential_changes_are_in_a_chain_that_verifies(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str, tmp_path: Path
) -> None:
    node = await start_node(ratchet.Registry([three, approve]), task_max_restarts=10,
                            max_step_attempts=10, task_backoff_base=0.01, max_recoveries=2)
    assert node.store is not None and node.tasks is not None
    ann = await client_as(node, nats_url, "ann", "acme", ["approver"])
    dana = await client_as(node, nats_url, "dana", "_system", ["approver"])
    # 1. An approver's admin approve, after a decision the task refused (another request).
    paid, asked = await _approval(client, 900, "a-1")
    ref = await node.tasks.ensure_running(paid)
    assert ref is not None
    stale = Envelope(type="approval.decision", message_id="stale-1", correlation_id="stale-1",
                     body={"task_id": paid, "approval_id": asked["approval_id"],
                           "decision": "approve", "decided_by": "eve",
                           "request_hash": "sha256:" + "1" * 64})
    assert await ref.ask(DeliverMail(stale), timeout=10) == "request changed"
    ok = await admin(ann, "approve", command_id="apr-1", principal=APPROVER, task_id=paid,
                     args={"approval_id": asked["approval_id"]})
    assert ok.ok, ok.error
    # 2. A rejection on ratchet.decisions, and one for this task sent on another tenant's
    #    subject (not found there: dead-lettered, and audited first).
    declined, asked_b = await _approval(client, 50, "a-2")
    dead = await client.nc.subscribe(dlq_subject("decisions", "globex"))
    await subscriptions_registered(client.nc)
    await _decide(dana, declined, asked_b["approval_id"], "approve", tenant="globex",
                  message_id="d-globex")
    await asyncio.wait_for(dead.next_msg(timeout=10), 15)
    await _decide(dana, declined, asked_b["approval_id"], "reject")
    await run_until(client, declined, DONE)
    # 3. A crash-loop handoff resolved by a rejection on ratchet.decisions.
    looping = (await client.submit("three", {"always_fail_at": 1}, key="loop")).task_id
    await run_until(client, looping, {"task.recovery_stopped"})
    [handoff] = await node.store.handoffs(looping)
    await _decide(dana, looping, handoff["package"]["approval_id"], "reject")
    assert (await wait_terminal(client, looping))[-1].type == "task.failed"
    # 4. Credential changes (their verbs come with the authentication work).
    for verb in ("bootstrap", "grant", "revoke"):
        await node.store.audit(credential_entry("_system", node.clock.now(), "root", verb,
                                                f"cred-{verb}", {"name": "olga"}))

    entries = {(e["verb"], e["principal"], e["task_id"], e["outcome"],
                (e["detail"] or {}).get("kind")) for e in await node.store.audit_log()}
    assert {("approve", "eve", paid, "request changed", None),
            ("approve", "ann", paid, "requested", None),
            ("approve", "ann", paid, "applied", "approval"),
            ("approve", "ann", paid, "ok", None),
            ("approve", "dana", declined, "NOT_FOUND", None),
            ("reject", "dana", declined, "applied", "approval"),
            ("reject", "dana", looping, "applied", "crash_loop"),
            ("bootstrap", "root", None, "ok", None), ("grant", "root", None, "ok", None),
            ("revoke", "root", None, "ok", None)} <= entries
    answer = await admin(client, "verify-audit", command_id="v-1", principal=OPERATOR,
                         tenant="_system")
    assert answer.ok and answer.result is not None, answer.error
    assert answer.result["ok"] and answer.result["problems"] == []
    # One each, above, and the three grants (the node's local admin, ann and dana).
    assert answer.result["entries"] == answer.result["head_seq"] == 14
    vic = await client_as(node, nats_url, "vic", "_system", ["viewer"])
    refused = await admin(vic, "verify-audit", command_id="v-2", tenant="_system")
    assert refused.error is not None and refused.error.code == "PERMISSION_DENIED"
    for c in (ann, dana, vic):
        await c.close()
    code, printed = await _cli_verify(nats_url, tmp_path / "node")
    assert code == 0 and printed["ok"]


@pytest.mark.parametrize("name", list(TAMPERING))
@sqlite_only("it tampers the audit rows through the SQLite file")
async def test_tampering_is_reported_at_start_and_by_verify_audit_and_the_node_serves_on(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str, tmp_path: Path, name: str
) -> None:
    node = await start_node(node_id="n1")
    for i in range(4):  # nine entries: the local admin key's grant, then requested and ok
        assert (await admin(client, "list", command_id=f"l-{i}")).ok
    await node.stop()
    how, first = TAMPERING[name]
    _tamper(tmp_path / "node" / "ratchet.db", how)
    alarms = await client.nc.subscribe("ratchet.events._system.n1.node.audit_tampered")
    await subscriptions_registered(client.nc)

    node = await start_node(node_id="n1")
    await asyncio.wait_for(node.audit_checked.wait(), 15)
    assert node.audit_report is not None and not node.audit_report.ok
    assert _seqs(node.audit_report)[0] == first, node.audit_report
    alarm = msgpack.unpackb((await alarms.next_msg(timeout=15)).data)
    assert alarm["type"] == "node.audit_tampered" and alarm["tenant"] == "_system"
    assert alarm["payload"]["problems"] == node.audit_report.problems[:20]

    answer = await admin(client, "verify-audit", command_id="v-1", principal=OPERATOR,
                         tenant="_system")
    assert answer.result is not None and not answer.result["ok"]
    # After a truncation the verb's own first entry leaves the deleted numbers as a gap.
    assert answer.result["problems"][0]["seq"] == (10 if name == "delete-newest" else first)
    code, printed = await _cli_verify(nats_url, tmp_path / "node")
    assert code == 1 and not printed["ok"]
    task_id = (await client.submit("three", {}, key=f"after-{name}")).task_id  # it serves on
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"


def test_a_key_file_that_is_not_a_key_stops_the_seal_rather_than_replace_it(
    tmp_path: Path
) -> None:
    AuditSeal.open(tmp_path)
    key = tmp_path / "keys" / "audit.key"
    key.write_text("not hex")
    with pytest.raises(ValueError, match="not an audit key"):
        AuditSeal.open(tmp_path)
    assert key.read_text() == "not hex" and os.stat(key).st_size == 7
