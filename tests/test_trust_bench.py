"""bench/trust.py against a default ``ratchet serve``: every attack of issue 12 is tried as
an attacker would (forged roles, unsigned and replayed requests, other tenants' subjects,
the JetStream API, forged mail, confused-deputy replies, revoked keys, an edited audit
row) and judged by its effect; none may succeed, and the same operations with the right
keys all do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_no_attack_of_the_trust_bench_succeeds_and_every_legitimate_operation_does() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "trust.py"), "--configs",
                           "default"], cwd=ROOT, capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["attacks_tried"] >= 20
    attacks = result["per_config"]["default"]["attacks"]
    assert all(outcome is False for outcome in attacks.values()), attacks  # tried, failed
    assert result["attacks_succeeded"] == 0, result["succeeded"]
    assert result["legit_ops_ok"] == result["legit_ops"] > 0, result["legit_failed"]
