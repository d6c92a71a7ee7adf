"""Each principal's NATS permissions, and the nats-server ``authorization`` block that
grants them (docs/security.md, "NATS permissions").

Policy as data: a principal's tenant and roles decide exactly which subjects its NATS user
may publish and subscribe to; everything else is refused by the server before Ratchet sees
it. The node's own user may do everything (``ratchet.mail.>``, ``ratchet.node.>``,
``ratchet.events.>``, the ``$JS.API`` of the streams); nobody else may.

A tenant principal's subjects name its tenant; a ``_system`` principal's name ``*`` (every
tenant) and, for the cluster verbs, ``_system``. Every user may subscribe to its own inbox,
``_INBOX.<its public key>.>``: the node answers there alone, and the replies of JetStream
(publish acks, consumer creation) arrive there too.

A subscriber follows events through a push consumer on RATCHET_EVENTS that it creates with
``$JS.API.CONSUMER.CREATE.RATCHET_EVENTS.<name>.<filter>``: the server checks that the
filter in the subject is the consumer's one, so a permission on the subject pins the filter
to the tenant's events. It may answer the consumer's flow control (``$JS.FC.RATCHET_EVENTS.>``);
it may not delete consumers (the server removes an idle one by itself). Sandbox forks'
events (``ratchet.sandbox.events.<tenant>.…``, stream RATCHET_SANDBOX) are the subscriber's
too, on their own subjects and consumers: following them is a choice, never a side effect of
following production's.

A ``tool_worker`` serves its tenant's remote tools (docs/protocol.md, "Serving a tool from
another process or language"): it may read its tenant's tool stream and consumers, pull
from and ack them (``$JS.API.CONSUMER.MSG.NEXT.RATCHET_TOOLS_<t>.*``, ``$JS.ACK.RATCHET_TOOLS_<t>.>``:
the stream token is the tenant, which is why each tenant has its own stream), publish
replies on ``ratchet.toolreply.<t>.*`` and dead letters on ``ratchet.dlq.tools.<t>``, and
answer liveness probes: it subscribes to ``ratchet.toolping.<t>.*`` and may respond to what
it receives there (NATS ``allow_responses``: one reply to each request, to its reply
subject, nothing else). It may not create streams or consumers (a consumer's config could aim a push delivery at any
subject); nodes create them. A ``_system`` principal gets no tool subjects: a worker
serves one tenant per key.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ratchet.protocol.admin_verbs import CLUSTER_VERBS, SYSTEM_TENANT, VERB_ROLES
from ratchet.protocol.auth import Principal, inbox_prefix
from ratchet.protocol.subjects import STREAM_EVENTS, STREAM_SANDBOX, dlq_subject, tool_stream

__all__ = ["Permissions", "authorization_block", "node_permissions", "permissions"]

#: (publish allow list, subscribe allow list), each sorted.
Permissions = tuple[list[str], list[str]]


def _admin_subjects(who: Principal, scope: str) -> list[str]:
    """One subject per admin verb of the principal's roles: only those, so NATS refuses
    another role's verbs before the node does."""
    out = []
    for verb, role in VERB_ROLES.items():
        if not who.has(role):
            continue
        if verb in CLUSTER_VERBS:
            if who.tenant == SYSTEM_TENANT:  # a tenant's cluster verb is refused anyway
                out.append(f"ratchet.admin.{SYSTEM_TENANT}.{verb}")
        else:
            out.append(f"ratchet.admin.{scope}.{verb}")
    return out


def permissions(who: Principal) -> Permissions:
    """The subjects ``who``'s NATS user may publish to and subscribe to."""
    scope = "*" if who.tenant == SYSTEM_TENANT else who.tenant
    pub: list[str] = []
    sub = [f"{inbox_prefix(who.public_key)}.>"]
    if who.has("producer"):
        pub += [f"ratchet.submit.{scope}", f"ratchet.api.{scope}.>"]
    if who.has("subscriber"):
        sub.append(f"ratchet.events.{scope}.>")
        sub.append(f"ratchet.sandbox.events.{scope}.>")
        pub += [f"$JS.API.CONSUMER.CREATE.{STREAM_EVENTS}.*.ratchet.events.{scope}.>",
                f"$JS.FC.{STREAM_EVENTS}.>",
                f"$JS.API.CONSUMER.CREATE.{STREAM_SANDBOX}.*.ratchet.sandbox.events.{scope}.>",
                f"$JS.FC.{STREAM_SANDBOX}.>"]
    pub += _admin_subjects(who, scope)
    if who.has("approver"):
        pub.append(f"ratchet.decisions.{scope}")
    if who.has("confirmer"):
        pub.append(f"ratchet.external.{scope}")
    if who.has("tool_worker") and who.tenant != SYSTEM_TENANT:
        pub += _tool_worker_subjects(who.tenant)
        sub.append(f"ratchet.toolping.{who.tenant}.*")
    return sorted(pub), sorted(sub)


def _responds(who: Principal) -> bool:
    """Whether ``who`` answers requests it receives (a tool worker's liveness probes)."""
    return who.has("tool_worker") and who.tenant != SYSTEM_TENANT


def _tool_worker_subjects(tenant: str) -> list[str]:
    """What serving ``tenant``'s tools takes, and nothing of another tenant's."""
    stream = tool_stream(tenant)
    return [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.CONSUMER.INFO.{stream}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*", f"$JS.ACK.{stream}.>",
            f"ratchet.toolreply.{tenant}.*", dlq_subject("tools", tenant)]


def node_permissions() -> Permissions:
    """A Ratchet node: every subject, internal ones and the JetStream API included."""
    return [">"], [">"]


def _allow(subjects: list[str]) -> str:
    one_line = "allow: [" + ", ".join(f'"{s}"' for s in subjects) + "]"
    if len(one_line) <= 72:
        return one_line
    # One subject a line: the file is read (and diffed) by people too.
    return "allow: [\n" + "".join(f'          "{s}"\n' for s in subjects) + "        ]"


def _user(key: str, perms: Permissions, comment: str, responds: bool = False) -> list[str]:
    pub, sub = perms
    # An empty allow list would mean "no restriction" to nats-server: nothing to publish
    # is said with a deny of everything.
    publish = _allow(pub) if pub else 'deny: [">"]'
    last = [f"        subscribe: {{ {_allow(sub)} }} }} }}"] if not responds else [
        f"        subscribe: {{ {_allow(sub)} }}", "        allow_responses: true } }"]
    return [f"    # {comment}",
            f'    {{ nkey: "{key}", permissions: {{',
            f"        publish: {{ {publish} }}", *last]


def _comment(who: Principal) -> str:
    """A principal's keyring entry, readable back (tests/test_nats_auth.py does)."""
    return f"{who.name} of {who.tenant}: {' '.join(sorted(who.roles))}"


def authorization_block(principals: Iterable[Principal], node_keys: Iterable[str] = (),
                        now: float | None = None) -> str:
    """The nats-server ``authorization`` block: the node keys with every permission, then
    one nkey user per principal not expired at ``now`` (wall time; default: the time now).

    No user means no anonymous connection: the server refuses any client that does not
    prove one of these keys."""
    at = time.time() if now is None else now
    nodes = sorted(set(node_keys))
    lines = ["authorization {", "  users = ["]
    for key in nodes:
        lines += _user(key, node_permissions(), "a Ratchet node")
    for who in sorted(principals, key=lambda p: (p.tenant, p.name, p.public_key)):
        if who.public_key in nodes or (who.expires_at is not None and at >= who.expires_at):
            continue  # a node key already has everything; an expired key nothing
        lines += _user(who.public_key, permissions(who), _comment(who), _responds(who))
    return "\n".join([*lines, "  ]", "}", ""])
