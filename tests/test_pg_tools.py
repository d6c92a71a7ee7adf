"""Tools that read the store outside a node go through ``RATCHET_STORE`` too: with a
PostgreSQL store, ``ratchet nats-config`` reads the keyring in PostgreSQL and makes no
SQLite file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg

from tests.conftest import RATCHET_BIN, ROOT


def test_nats_config_reads_the_keyring_of_the_postgresql_store(pg_url: str,
                                                               tmp_path: Path) -> None:
    state = tmp_path / "machine"
    done = subprocess.run([str(RATCHET_BIN), "--state-dir", str(state), "nats-config"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RATCHET_STORE": pg_url})
    assert done.returncode == 0, done.stderr
    assert "authorization" in done.stdout
    assert not (state / "ratchet.db").exists()
    with psycopg.connect(pg_url) as conn:  # the bootstrap's grants went to PostgreSQL
        granted = conn.execute("SELECT COUNT(*) FROM principals").fetchone()
    assert granted is not None and granted[0] >= 1
