"""The NATS permission table (protocol/nats_permissions.py) as data, without a server: what
each role may publish and subscribe to, that nobody but a node reaches the internal
subjects, and that the sample configuration in docs/examples is what the table gives."""

from __future__ import annotations

import itertools
import re
import subprocess

import pytest

from ratchet.protocol.admin_verbs import CLUSTER_VERBS, VERB_ROLES
from ratchet.protocol.auth import ROLES, Principal, Signer, new_seed
from ratchet.protocol.nats_permissions import authorization_block, node_permissions, permissions
from ratchet.supervisors.node.embedded_nats import find_nats_server
from tests.conftest import ROOT

SAMPLE = ROOT / "docs" / "examples" / "nats-tenants.conf"
KEY = Signer(new_seed()).public_key
INBOX = f"_INBOX.{KEY}.>"


def _who(tenant: str, *roles: str, key: str = KEY, expires_at: float | None = None) -> Principal:
    return Principal(name="p", tenant=tenant, roles=frozenset(roles), public_key=key,
                     expires_at=expires_at)


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more at the end."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def _may(patterns: list[str], subject: str) -> bool:
    return any(_matches(p, subject) for p in patterns)


def test_a_producer_publishes_its_tenants_submits_and_api_requests_only() -> None:
    assert permissions(_who("acme", "producer")) == (
        ["ratchet.api.acme.>", "ratchet.submit.acme"], [INBOX])


def test_a_subscriber_reads_its_tenants_events_through_consumers_pinned_to_them() -> None:
    assert permissions(_who("acme", "subscriber")) == (
        ["$JS.API.CONSUMER.CREATE.RATCHET_EVENTS.*.ratchet.events.acme.>",
         "$JS.API.CONSUMER.CREATE.RATCHET_SANDBOX.*.ratchet.sandbox.events.acme.>",
         "$JS.FC.RATCHET_EVENTS.>", "$JS.FC.RATCHET_SANDBOX.>"],
        [INBOX, "ratchet.events.acme.>", "ratchet.sandbox.events.acme.>"])


def test_sandbox_events_are_a_subject_space_of_their_own_that_production_filters_miss() -> None:
    _, sub = permissions(_who("acme", "subscriber"))
    assert _may(sub, "ratchet.sandbox.events.acme.tsk_f.task.succeeded")
    assert not _may(sub, "ratchet.sandbox.events.globex.tsk_f.task.succeeded")
    assert not _matches("ratchet.events.>", "ratchet.sandbox.events.acme.tsk_f.task.queued")


def test_a_tool_worker_pulls_acks_and_answers_its_tenants_tool_requests_only() -> None:
    pub, sub = permissions(_who("acme", "tool_worker"))
    # Deliveries come to its inbox, through a consumer; liveness probes on its tenant's
    # ping subjects (answered through NATS's allow_responses, not a publish grant).
    assert sub == [INBOX, "ratchet.toolping.acme.*"]
    for subject in ("$JS.API.CONSUMER.MSG.NEXT.RATCHET_TOOLS_acme.tools-acme-pay",
                    "$JS.ACK.RATCHET_TOOLS_acme.tools-acme-pay.1.7.7.1733220000000000000.0",
                    "$JS.API.CONSUMER.INFO.RATCHET_TOOLS_acme.tools-acme-pay",
                    "$JS.API.STREAM.INFO.RATCHET_TOOLS_acme",
                    "ratchet.toolreply.acme.n1-0a1b2c", "ratchet.dlq.tools.acme"):
        assert _may(pub, subject), subject
    for subject in ("$JS.API.CONSUMER.MSG.NEXT.RATCHET_TOOLS_globex.tools-globex-pay",
                    "$JS.ACK.RATCHET_TOOLS_globex.tools-globex-pay.1.7.7.1.0",
                    "ratchet.toolreply.globex.n1-0a1b2c",
                    "$JS.API.CONSUMER.CREATE.RATCHET_TOOLS_acme.w.ratchet.tools.acme.pay",
                    "$JS.API.CONSUMER.DURABLE.CREATE.RATCHET_TOOLS_acme.w",
                    "$JS.API.STREAM.CREATE.RATCHET_TOOLS_acme",
                    "ratchet.tools.acme.pay", "ratchet.dlq.mail.acme"):
        assert not _may(pub, subject), subject
    # A worker serves one tenant per key: _system's would be every tenant's.
    assert permissions(_who("_system", "tool_worker")) == ([], [INBOX])


def test_admin_roles_publish_the_verbs_of_their_roles_in_their_tenant() -> None:
    viewer_verbs = {v for v, r in VERB_ROLES.items() if r == "viewer"} - CLUSTER_VERBS
    pub, _ = permissions(_who("acme", "viewer"))
    assert set(pub) == {f"ratchet.admin.acme.{v}" for v in viewer_verbs}
    pub, _ = permissions(_who("acme", "approver"))
    approver_verbs = {v for v, r in VERB_ROLES.items() if r == "approver"}
    assert {"approve", "reject", "resolve"} <= approver_verbs
    assert set(pub) == {f"ratchet.admin.acme.{v}" for v in viewer_verbs | approver_verbs} \
        | {"ratchet.decisions.acme"}
    pub, _ = permissions(_who("acme", "operator"))
    assert "ratchet.admin.acme.cancel" in pub and "ratchet.admin.acme.get" in pub
    assert not any("approve" in s or "decisions" in s or "_system" in s for s in pub)
    assert permissions(_who("acme", "confirmer")) == (["ratchet.external.acme"], [INBOX])


def test_system_principals_act_in_every_tenant_and_alone_reach_the_cluster_verbs() -> None:
    pub, sub = permissions(_who("_system", "operator", "subscriber"))
    assert _may(pub, "ratchet.admin.globex.cancel") and _may(pub, "ratchet.admin._system.drain")
    assert _may(pub, "ratchet.admin._system.grant") and _may(sub, "ratchet.events.acme.t.x")
    assert not _may(pub, "ratchet.admin.acme.drain")  # a cluster verb only as _system's
    tenant_pub, _ = permissions(_who("acme", *ROLES))
    assert not any(_may(tenant_pub, f"ratchet.admin.{t}.{v}")
                   for t in ("acme", "_system") for v in CLUSTER_VERBS)


@pytest.mark.parametrize("tenant", ["acme", "_system"])
def test_nobody_but_a_node_publishes_internal_subjects_or_manages_streams(tenant: str) -> None:
    internal = ["ratchet.mail.3.tsk_a.task", "ratchet.node.n1.admin.acme.get",
                "ratchet.events.acme.tsk_a.task.succeeded", "ratchet.dlq.mail.acme",
                "$JS.API.STREAM.PURGE.RATCHET_EVENTS", "$JS.API.STREAM.DELETE.RATCHET_SUBMIT",
                "$JS.API.STREAM.NAMES", "$JS.API.CONSUMER.DELETE.RATCHET_EVENTS.w",
                "$JS.API.CONSUMER.CREATE.RATCHET_MAIL.w.ratchet.mail.>",
                "$JS.API.CONSUMER.CREATE.RATCHET_EVENTS.w", "_INBOX.UOTHER.x"]
    for n in range(1, len(ROLES) + 1):
        for roles in itertools.combinations(sorted(ROLES), n):
            pub, sub = permissions(_who(tenant, *roles))
            assert not [s for s in internal if _may(pub, s)], roles
            assert not _may(sub, "ratchet.mail.3.tsk_a.task") and not _may(sub, "_INBOX.U.x")
    assert all(_may(node_permissions()[0], s) for s in internal)


def test_a_tenants_keys_never_reach_another_tenants_subjects() -> None:
    pub, sub = permissions(_who("acme", *ROLES))
    for subject in ("ratchet.submit.globex", "ratchet.api.globex.get",
                    "ratchet.admin.globex.get", "ratchet.decisions.globex",
                    "ratchet.external.globex",
                    "$JS.API.CONSUMER.CREATE.RATCHET_EVENTS.w.ratchet.events.globex.>",
                    "$JS.API.CONSUMER.CREATE.RATCHET_EVENTS.w.ratchet.events.>"):
        assert not _may(pub, subject), subject
    assert not _may(sub, "ratchet.events.globex.t.x")


def test_the_block_leaves_out_expired_keys_and_the_nodes_own() -> None:
    node = Signer(new_seed()).public_key
    alive, gone = Signer(new_seed()).public_key, Signer(new_seed()).public_key
    block = authorization_block([_who("acme", "producer", key=alive),
                                 _who("acme", "producer", key=gone, expires_at=10.0),
                                 _who("acme", "producer", key=node)], [node], now=20.0)
    assert alive in block and gone not in block
    assert block.count(node) == 1 and "anonymous" not in block


_ENTRY = re.compile(r'# (\S+) of (\S+): ([a-z ]+)\n\s*\{ nkey: "(U[A-Z0-9]+)"')
_NODE = re.compile(r'# a Ratchet node\n\s*\{ nkey: "(U[A-Z0-9]+)"')


def test_the_sample_configuration_is_what_the_table_gives_and_the_server_takes_it() -> None:
    text = SAMPLE.read_text()
    principals = [Principal(name=n, tenant=t, roles=frozenset(r.split()), public_key=k)
                  for n, t, r, k in _ENTRY.findall(text)]
    assert {p.tenant for p in principals} == {"acme", "globex", "_system"}
    assert authorization_block(principals, _NODE.findall(text)) in text
    assert "127.0.0.1" in text and "ratchet creds" in text and "password" not in text
    checked = subprocess.run([find_nats_server(), "-t", "-c", str(SAMPLE)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
