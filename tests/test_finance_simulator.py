"""The finance simulator, a real child process on loopback, seen through FinanceClient.

These pin the provider behaviour the runtime relies on: idempotency by key, lookup by key
for reconciliation, and faults that land on each side of the commit.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from ratchet.protocol.errors import (
    ToolConflict,
    ToolInvalidArgument,
    ToolOutcomeUnknown,
    ToolPermissionDenied,
    ToolRateLimited,
    ToolTransient,
)
from ratchet.testing import FinanceClient, FinanceSimulatorProcess

CLAIM = {"employee": "e-17", "amount": 120.5, "currency": "EUR", "claim_id": "c-1"}


@pytest.fixture(scope="module")
def simulator() -> Iterator[FinanceSimulatorProcess]:
    with FinanceSimulatorProcess() as sim:
        yield sim


@pytest.fixture
def client(simulator: FinanceSimulatorProcess) -> FinanceClient:
    finance = FinanceClient(simulator.url, timeout=2.0)
    finance.reset()
    return finance


def _raw(url: str, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    """One request with an arbitrary body, below the client's safety net."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=2)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _wait_for(client: FinanceClient, key: str, deadline: float = 3.0) -> dict[str, Any] | None:
    """Poll query() until the simulator's own delayed processing has stored ``key``."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        found = client.query(key)
        if found is not None:
            return found
        time.sleep(0.05)
    return None


# -- idempotency ---------------------------------------------------------------------------


def test_a_first_claim_is_completed_and_takes_effect_once(client: FinanceClient) -> None:
    result = client.submit_claim("k1", CLAIM)

    assert result["status"] == "completed"
    assert result["provider_id"] == "clm_000001"
    assert result["operation"] == "claims"
    assert result["idempotency_key"] == "k1"
    assert result["amount"] == CLAIM["amount"]
    assert client.effects() == {"k1": 1}


def test_a_replay_with_the_same_key_and_body_returns_the_same_result_without_effect(
    client: FinanceClient,
) -> None:
    first = client.submit_claim("k1", CLAIM)
    again = client.submit_claim("k1", dict(reversed(list(CLAIM.items()))))

    assert again == first
    assert client.effects() == {"k1": 1}


def test_reusing_a_key_for_a_different_body_is_a_conflict(client: FinanceClient) -> None:
    client.submit_claim("k1", CLAIM)

    with pytest.raises(ToolConflict):
        client.submit_claim("k1", {**CLAIM, "amount": 999})
    assert client.effects() == {"k1": 1}


def test_reusing_a_claim_key_for_a_refund_is_a_conflict(client: FinanceClient) -> None:
    client.submit_claim("k1", CLAIM)

    with pytest.raises(ToolConflict):
        client.refund("k1", CLAIM)


def test_a_refund_gets_its_own_provider_id(client: FinanceClient) -> None:
    client.submit_claim("k1", CLAIM)
    refund = client.refund("k1-refund", {"claim_id": "c-1", "amount": 120.5})

    assert refund["provider_id"] == "rfd_000001"
    assert refund["operation"] == "refunds"
    assert client.effects() == {"k1": 1, "k1-refund": 1}


def test_query_finds_a_committed_action_and_returns_none_for_an_unknown_key(
    client: FinanceClient,
) -> None:
    result = client.submit_claim("k/with spaces?", CLAIM)

    assert client.query("k/with spaces?") == result
    assert client.query("never-sent") is None


# -- faults around the commit ------------------------------------------------------------


def test_a_response_dropped_after_commit_is_an_unknown_outcome_but_the_claim_exists(
    client: FinanceClient,
) -> None:
    client.add_faults([{"op": "claims", "mode": "drop_after_commit"}])

    with pytest.raises(ToolOutcomeUnknown):
        client.submit_claim("k1", CLAIM)

    assert client.effects() == {"k1": 1}
    found = client.query("k1")
    assert found is not None and found["status"] == "completed"


def test_a_connection_dropped_before_commit_is_an_unknown_outcome_and_nothing_exists(
    client: FinanceClient,
) -> None:
    client.add_faults([{"op": "claims", "mode": "drop_before_commit"}])

    with pytest.raises(ToolOutcomeUnknown):
        client.submit_claim("k1", CLAIM)

    assert client.query("k1") is None
    assert client.effects() == {}


def test_a_429_is_rate_limited_with_the_providers_retry_after_and_commits_nothing(
    client: FinanceClient,
) -> None:
    client.add_faults([{"op": "claims", "mode": "status_429", "retry_after": 2.5}])

    with pytest.raises(ToolRateLimited) as caught:
        client.submit_claim("k1", CLAIM)

    assert caught.value.retry_after == 2.5
    assert client.effects() == {}
    assert client.submit_claim("k1", CLAIM)["status"] == "completed"  # the rule is used up


@pytest.mark.parametrize("mode", ["status_500", "status_503"])
def test_a_5xx_is_transient_and_commits_nothing(client: FinanceClient, mode: str) -> None:
    client.add_faults([{"op": "*", "mode": mode}])

    with pytest.raises(ToolTransient):
        client.submit_claim("k1", CLAIM)

    assert client.effects() == {}


def test_a_slow_provider_times_out_as_unknown_but_commits_exactly_once(
    simulator: FinanceSimulatorProcess, client: FinanceClient
) -> None:
    client.add_faults([{"op": "claims", "mode": "slow", "delay": 0.6}])
    impatient = FinanceClient(simulator.url, timeout=0.2)

    with pytest.raises(ToolOutcomeUnknown):
        impatient.submit_claim("k1", CLAIM)

    found = _wait_for(client, "k1")
    assert found is not None and found["status"] == "completed"
    assert client.effects() == {"k1": 1}


def test_an_accepted_claim_is_pending_until_the_provider_confirms_it(
    client: FinanceClient,
) -> None:
    client.add_faults([{"op": "claims", "mode": "accept"}])

    accepted = client.submit_claim("k1", CLAIM)
    assert accepted["status"] == "pending"
    assert client.query("k1") == accepted

    client.confirm("k1")
    confirmed = client.query("k1")
    assert confirmed is not None and confirmed["status"] == "completed"
    assert client.effects() == {"k1": 1}


def test_a_rule_with_a_key_only_affects_that_key(client: FinanceClient) -> None:
    client.add_faults([{"op": "*", "mode": "status_500", "key": "victim", "times": 2}])

    assert client.submit_claim("bystander", CLAIM)["status"] == "completed"
    with pytest.raises(ToolTransient):
        client.submit_claim("victim", CLAIM)
    with pytest.raises(ToolTransient):
        client.refund("victim", CLAIM)
    assert client.submit_claim("victim", CLAIM)["status"] == "completed"
    assert client.effects() == {"bystander": 1, "victim": 1}


def test_a_failed_query_is_transient(client: FinanceClient) -> None:
    client.submit_claim("k1", CLAIM)
    client.add_faults([{"op": "query", "mode": "drop_before_commit"}])

    with pytest.raises(ToolTransient):
        client.query("k1")
    assert client.query("k1") is not None


def test_clearing_faults_removes_every_rule(client: FinanceClient) -> None:
    client.add_faults([{"op": "*", "mode": "status_500", "times": 5}])
    client.clear_faults()

    assert client.submit_claim("k1", CLAIM)["status"] == "completed"


# -- refusals and bad input ------------------------------------------------------------------


def test_a_negative_amount_is_an_invalid_argument(client: FinanceClient) -> None:
    with pytest.raises(ToolInvalidArgument):
        client.submit_claim("k1", {**CLAIM, "amount": -1})
    assert client.effects() == {}


def test_a_denied_permission_is_refused_and_commits_nothing(client: FinanceClient) -> None:
    with pytest.raises(ToolPermissionDenied):
        client.submit_claim("k1", CLAIM, headers={"X-Permission": "deny"})
    assert client.effects() == {}


def test_malformed_json_gets_a_400_and_the_server_keeps_serving(
    simulator: FinanceSimulatorProcess, client: FinanceClient
) -> None:
    status, body = _raw(simulator.url, "POST", "/claims", b'{"idempotency_key": "k1", ')
    assert status == 400
    assert b"invalid_argument" in body

    status, _ = _raw(simulator.url, "POST", "/claims", b'{"amount": 1}')  # no key at all
    assert status == 400

    assert client.health()
    assert client.submit_claim("k1", CLAIM)["status"] == "completed"


def test_an_unknown_path_is_a_json_404(simulator: FinanceSimulatorProcess) -> None:
    status, body = _raw(simulator.url, "GET", "/nowhere", b"")
    assert status == 404
    assert b"not_found" in body


def test_a_refused_connection_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port any more: the connection is refused before sending.
    closed = FinanceClient(f"http://127.0.0.1:{port}", timeout=1.0)

    with pytest.raises(ToolTransient):
        closed.submit_claim("k1", CLAIM)
    assert closed.health() is False
