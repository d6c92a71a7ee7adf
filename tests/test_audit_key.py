"""The audit key shared by nodes on several machines (docs/security.md, "The audit key"):
given by ``RATCHET_AUDIT_KEY`` or ``--audit-key-file``, checked against the check value the
store records, and a node with another key refused at start (AUDIT_KEY_MISMATCH, exit 18)
instead of logging the other nodes' entries as tampered. One machine needs none of it: its
state dir's key file is made as before."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bench.steps import NodeProc
from ratchet.persistence.admin_rows import credential_entry
from ratchet.persistence.audit_key import CHECK_NAME
from ratchet.persistence.audit_seal import AuditSeal
from ratchet.persistence.store import Store
from ratchet.protocol.errors import ErrorCode, StartRefused, UsageError
from ratchet.supervisors.cli.common import ExitCode
from ratchet.supervisors.node.audit_key import AUDIT_KEY_ENV, load_audit_key
from tests.conftest import RATCHET_BIN, ROOT, NodeFactory
from tests.pg_nodes import SECRET_KEY, node_dsn, prepare, until

KEY_A, KEY_B = bytes(range(32)), bytes(range(1, 33))


async def _sealed(path: Path, state: Path, key: bytes | None) -> Store:
    return await Store.open(path, audit_seal=AuditSeal.open(state, key))


async def _write_entry(store: Store, n: int) -> None:
    await store.audit(credential_entry("_system", 1.0 * n, "root", "grant", f"c-{n}", {}))


# -- loading the key ------------------------------------------------------------------------


def test_the_audit_key_is_read_as_hex_or_base64_from_the_environment_first(
        tmp_path: Path) -> None:
    assert load_audit_key(None, {AUDIT_KEY_ENV: KEY_A.hex()}) == KEY_A
    assert load_audit_key(None, {AUDIT_KEY_ENV: base64.b64encode(KEY_A).decode()}) == KEY_A
    key_file = tmp_path / "audit.key"
    key_file.write_text(KEY_B.hex() + "\n")
    key_file.chmod(0o600)
    assert load_audit_key(key_file, {}) == KEY_B
    assert load_audit_key(key_file, {AUDIT_KEY_ENV: KEY_A.hex()}) == KEY_A
    assert load_audit_key(None, {}) is None  # the state dir's own file, as before


def test_a_malformed_or_missing_audit_key_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="RATCHET_AUDIT_KEY: an audit key is 32 bytes"):
        load_audit_key(None, {AUDIT_KEY_ENV: "abcd"})
    with pytest.raises(UsageError, match="--audit-key-file"):
        load_audit_key(tmp_path / "nowhere", {})


# -- the store's check value ------------------------------------------------------------------


async def test_the_first_key_is_recorded_and_another_refused_before_anything_is_judged(
        tmp_path: Path) -> None:
    path = tmp_path / "ratchet.db"
    first = await _sealed(path, tmp_path / "a", KEY_A)
    try:
        assert await first.claim_audit_key()
        assert not await first.claim_audit_key()  # recorded once
        await _write_entry(first, 1)
    finally:
        await first.close()
    assert not (tmp_path / "a" / "keys" / "audit.key").exists()  # a given key is not stored
    same = await _sealed(path, tmp_path / "b", KEY_A)  # another machine, the same key
    try:
        assert not await same.claim_audit_key()
        await _write_entry(same, 2)
        report = await same.verify_audit()
        assert report.ok and report.entries == 2, report.problems
    finally:
        await same.close()
    other = await _sealed(path, tmp_path / "c", KEY_B)
    try:
        with pytest.raises(StartRefused) as refused:
            await other.claim_audit_key()
        assert refused.value.code == ErrorCode.AUDIT_KEY_MISMATCH
        assert "RATCHET_AUDIT_KEY" in refused.value.message
    finally:
        await other.close()
    db = sqlite3.connect(path)
    try:
        [(check,)] = db.execute("SELECT value FROM cluster_secrets WHERE name = ?",
                                (CHECK_NAME,)).fetchall()
    finally:
        db.close()
    assert KEY_A.hex() not in bytes(check).decode()  # a check value, never the key


async def test_a_store_without_a_check_value_is_judged_by_its_newest_keyed_entry(
        tmp_path: Path) -> None:
    path = tmp_path / "ratchet.db"
    old = await _sealed(path, tmp_path / "a", KEY_A)  # written before the check existed
    try:
        await _write_entry(old, 1)
    finally:
        await old.close()
    other = await _sealed(path, tmp_path / "b", KEY_B)
    try:
        with pytest.raises(StartRefused, match="newest audit entry \\(1\\) does not verify"):
            await other.claim_audit_key()
    finally:
        await other.close()
    right = await _sealed(path, tmp_path / "c", KEY_A)
    try:
        assert await right.claim_audit_key()
    finally:
        await right.close()


def test_a_refused_seal_discards_only_the_files_it_made(tmp_path: Path) -> None:
    made = AuditSeal.open(tmp_path / "new")  # makes the key and the head
    assert (tmp_path / "new" / "audit.head").exists()
    made.discard()
    assert not (tmp_path / "new" / "audit.head").exists()
    assert not (tmp_path / "new" / "keys" / "audit.key").exists()
    AuditSeal.open(tmp_path / "old")
    found = AuditSeal.open(tmp_path / "old")  # found them: evidence, kept
    found.discard()
    assert (tmp_path / "old" / "audit.head").exists()


async def test_a_node_on_one_machine_needs_no_audit_key_given(
        start_node: NodeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUDIT_KEY_ENV, raising=False)
    node = await start_node()
    await asyncio.wait_for(node.audit_checked.wait(), 30)
    assert (tmp_path / "node" / "keys" / "audit.key").exists()  # made at the first start
    assert node.audit_report is not None and node.audit_report.ok
    assert node.store is not None
    assert not await node.store.claim_audit_key()  # recorded at start


# -- real nodes on one PostgreSQL, each with its own state dir ---------------------------------


def _machine(base: Path, name: str, dsn: str, nats_url: str, key: bytes) -> NodeProc:
    return NodeProc(base / name, nats_url, app="tests.apps:app", log_level="info",
                    env={"RATCHET_STORE": node_dsn(dsn, name), "RATCHET_SECRET_KEY": SECRET_KEY,
                         AUDIT_KEY_ENV: key.hex()},
                    args=("--node-id", name), log_path=base / f"{name}.log")


async def _verify(state: Path, nats_url: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", "admin",
        "verify-audit", "--nats-url", nats_url, cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out
    return dict(json.loads(out))


async def _log_says(path: Path, text: str, timeout: float = 30.0) -> None:
    await until(lambda: text in path.read_text(), timeout, f"{path.name} says {text!r}")


@pytest.mark.slow
async def test_nodes_on_several_machines_with_one_audit_key_verify_each_others_entries(
        pg_url: str, nats_url: str, tmp_path: Path) -> None:
    await prepare(pg_url)
    a, b = (_machine(tmp_path, n, pg_url, nats_url, KEY_A) for n in ("a", "b"))
    try:
        await asyncio.to_thread(a.start)
        await asyncio.to_thread(b.start)  # checks a's entries (a's bootstrap grant)
        for name in ("a", "b"):
            await _log_says(tmp_path / f"{name}.log", "audit chain verified")
        report = await _verify(b.state_dir, nats_url)
        assert report["ok"] and report["entries"] >= 2, report
        assert report["problems"] == []
    finally:
        a.stop()
        b.stop()
    for name in ("a", "b"):
        assert "tampered" not in (tmp_path / f"{name}.log").read_text()
        assert not (tmp_path / name / "keys" / "audit.key").exists()  # nothing copied


@pytest.mark.slow
async def test_a_node_with_another_audit_key_refuses_to_start(
        pg_url: str, nats_url: str, tmp_path: Path) -> None:
    await prepare(pg_url)
    a = _machine(tmp_path, "a", pg_url, nats_url, KEY_A)
    b = _machine(tmp_path, "b", pg_url, nats_url, KEY_B)
    try:
        await asyncio.to_thread(a.start)
        with pytest.raises(RuntimeError, match="did not start"):
            await asyncio.to_thread(b.start)
        assert b.proc is not None
        assert await asyncio.to_thread(b.proc.wait, 30) == ExitCode.AUDIT_KEY_MISMATCH
        assert "AUDIT_KEY_MISMATCH" in (tmp_path / "b.log").read_text()
        # Nothing it made under the refused key is left to be judged forged later.
        assert not (tmp_path / "b" / "audit.head").exists()
    finally:
        a.stop()
        b.stop()
    assert "tampered" not in (tmp_path / "a.log").read_text()
    assert os.path.exists(tmp_path / "a" / "audit.head")
