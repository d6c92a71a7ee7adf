"""Subject names. Tenant (and, for actor mail, the partition) are always in the subject so
that NATS permissions can fence tenants and partitions can move between nodes."""

from __future__ import annotations

import re
import zlib

from ratchet.protocol.errors import InvalidMessage

__all__ = [
    "BRANCHES_ACTOR",
    "DEFAULT_PARTITIONS",
    "STREAM_SUBMIT",
    "STREAM_MAIL",
    "STREAM_EVENTS",
    "STREAM_DLQ",
    "STREAM_EXTERNAL",
    "STREAM_DECISIONS",
    "STREAM_SANDBOX",
    "LEGACY_STREAM_TOOLS",
    "decision_subject",
    "external_subject",
    "check_token",
    "check_worker_id",
    "is_worker_id",
    "is_token",
    "partition_of",
    "submit_subject",
    "api_subject",
    "branch_id",
    "branch_mail_subject",
    "mail_subject",
    "event_subject",
    "task_events_filter",
    "sandbox_event_subject",
    "sandbox_events_filter",
    "task_life_filter",
    "dlq_subject",
    "mail_route",
    "request_route",
    "tenant_of",
    "tool_durable",
    "tool_pinned_durable",
    "tool_ping_subject",
    "tool_pinned_subject",
    "tool_reply_route",
    "tool_reply_subject",
    "tool_stream",
    "tool_stream_subjects",
    "tool_subject",
]

DEFAULT_PARTITIONS = 16

STREAM_SUBMIT = "RATCHET_SUBMIT"
STREAM_MAIL = "RATCHET_MAIL"
STREAM_EVENTS = "RATCHET_EVENTS"
STREAM_DLQ = "RATCHET_DLQ"
STREAM_EXTERNAL = "RATCHET_EXTERNAL"
STREAM_DECISIONS = "RATCHET_DECISIONS"
STREAM_SANDBOX = "RATCHET_SANDBOX"
#: The first release's one stream for every tenant's tool requests (``ratchet.tools.>``),
#: replaced by one stream per tenant (:func:`tool_stream`); a node deletes it.
LEGACY_STREAM_TOOLS = "RATCHET_TOOLS"

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def is_token(value: str) -> bool:
    """Whether ``value`` is safe as one subject token (tenant, task id, actor, verb)."""
    return _TOKEN.match(value) is not None


def check_token(value: str, what: str) -> str:
    """Return ``value`` if it is safe as one subject token, else raise InvalidMessage."""
    if not is_token(value):
        raise InvalidMessage(f"{what} must match {_TOKEN.pattern}", field=what, value=value[:80])
    return value


def partition_of(task_id: str, partitions: int = DEFAULT_PARTITIONS) -> int:
    """Stable partition of a task: CRC-32, never Python's per-process salted ``hash()``."""
    return zlib.crc32(task_id.encode()) % partitions


def submit_subject(tenant: str) -> str:
    return f"ratchet.submit.{check_token(tenant, 'tenant')}"


def api_subject(tenant: str, verb: str) -> str:
    return f"ratchet.api.{check_token(tenant, 'tenant')}.{check_token(verb, 'verb')}"


def mail_subject(task_id: str, actor: str, partitions: int = DEFAULT_PARTITIONS) -> str:
    partition = partition_of(task_id, partitions)
    return f"ratchet.mail.{partition}.{check_token(task_id, 'task_id')}.{check_token(actor, 'actor')}"


#: The actor token of branch mail: ``ratchet.mail.<partition>.<task_id>.branches`` goes to
#: the node's branch host, not to the task's actor.
BRANCHES_ACTOR = "branches"


def branch_id(task_id: str, key: str, branch: str) -> str:
    """A fan-out branch's id, ``<task_id>/<fan-out key>/<branch>``: its messages'
    correlation id; its partition is ``partition_of(branch_id)`` (CRC-32, as a task's)."""
    return f"{task_id}/{key}/{branch}"


def branch_mail_subject(task_id: str, partition: int) -> str:
    """Where a task's branch mail placed on ``partition`` goes (``branch.start``,
    ``branch.hold``, ``branch.stop``): that partition's mail, actor token ``branches``."""
    return f"ratchet.mail.{partition}.{check_token(task_id, 'task_id')}.{BRANCHES_ACTOR}"


def event_subject(tenant: str, task_id: str, event_type: str) -> str:
    # Event types are dotted ("step.completed"), so they add tokens after the task id;
    # subscribers filter on ``ratchet.events.<tenant>.<task_id>.>``.
    return f"ratchet.events.{tenant}.{task_id}.{event_type}"


def task_events_filter(tenant: str, task_id: str) -> str:
    return f"ratchet.events.{check_token(tenant, 'tenant')}.{check_token(task_id, 'task_id')}.>"


def sandbox_event_subject(tenant: str, task_id: str, event_type: str) -> str:
    """A sandbox fork's event: the same message as :func:`event_subject`'s under
    ``ratchet.sandbox.events.``, so that no subscriber of ``ratchet.events.>`` (production)
    ever sees it (docs/protocol.md, "Sandbox forks")."""
    return f"ratchet.sandbox.events.{tenant}.{task_id}.{event_type}"


def sandbox_events_filter(tenant: str, task_id: str | None = None) -> str:
    """The events of one sandbox fork of ``tenant``, or of all of them (``task_id`` None)."""
    who = ">" if task_id is None else f"{check_token(task_id, 'task_id')}.>"
    return f"ratchet.sandbox.events.{check_token(tenant, 'tenant')}.{who}"


def task_life_filter(tenant: str, task_id: str | None = None) -> str:
    """The events of a task's life (``task.*``: its outcomes among them, no step or action
    events) of one task, or of every task of ``tenant`` when ``task_id`` is None."""
    who = "*" if task_id is None else check_token(task_id, "task_id")
    return f"ratchet.events.{check_token(tenant, 'tenant')}.{who}.task.>"


def dlq_subject(source: str, tenant: str) -> str:
    return f"ratchet.dlq.{source}.{tenant if is_token(tenant) else '_invalid'}"


def external_subject(tenant: str) -> str:
    """Where providers (or their webhook relays) send confirmations of accepted actions."""
    return f"ratchet.external.{check_token(tenant, 'tenant')}"


def decision_subject(tenant: str) -> str:
    """Where approval decisions arrive (the admin issue's ``approve``/``reject`` wrap this)."""
    return f"ratchet.decisions.{check_token(tenant, 'tenant')}"


def tool_subject(tenant: str, tool: str) -> str:
    """Where a remote tool's requests go (stream ``tool_stream(tenant)``;
    protocol/tool_wire.py)."""
    return f"ratchet.tools.{check_token(tenant, 'tenant')}.{check_token(tool, 'tool')}"


def tool_stream(tenant: str) -> str:
    """The stream of ``tenant``'s remote tool requests, ``RATCHET_TOOLS_<tenant>``: one per
    tenant, so that NATS permissions on the ``$JS`` subjects (which name a stream and a
    consumer, no subject) can keep a tenant's workers to its own requests."""
    return f"RATCHET_TOOLS_{check_token(tenant, 'tenant')}"


def tool_stream_subjects(tenant: str) -> str:
    """What ``tool_stream(tenant)`` holds: ``ratchet.tools.<tenant>.>``."""
    return f"ratchet.tools.{check_token(tenant, 'tenant')}.>"


def tool_durable(tenant: str, tool: str) -> str:
    """The durable pull consumer (in ``tool_stream(tenant)``) every worker of ``tool`` for
    ``tenant`` shares: one per (tenant, tool), so that a slow tool never holds up another's
    requests."""
    return f"tools-{check_token(tenant, 'tenant')}-{check_token(tool, 'tool')}"


_WORKER = re.compile(r"^[A-Za-z0-9_]{1,32}$")


def is_worker_id(worker: str) -> bool:
    return _WORKER.match(worker) is not None


def check_worker_id(worker: str) -> str:
    """A tool worker's id: ``[A-Za-z0-9_]{1,32}`` — no ``-``, so that the consumer name
    ``pin-<tenant>-<tool>-<worker>`` reads back one way only."""
    if _WORKER.match(worker) is None:
        raise InvalidMessage(f"worker id must match {_WORKER.pattern}", field="worker",
                             value=worker[:80])
    return worker


def tool_pinned_subject(tenant: str, tool: str, worker: str) -> str:
    """Where the calls of a session pinned to ``worker`` go: ``ratchet.tools.<tenant>.<tool>.
    <worker>`` (five tokens: the tool's shared consumer, filtering four, never sees them)."""
    return f"{tool_subject(tenant, tool)}.{check_worker_id(worker)}"


def tool_pinned_durable(tenant: str, tool: str, worker: str) -> str:
    """The consumer of :func:`tool_pinned_subject`, ``worker``'s alone:
    ``pin-<tenant>-<tool>-<worker>``."""
    return (f"pin-{check_token(tenant, 'tenant')}-{check_token(tool, 'tool')}"
            f"-{check_worker_id(worker)}")


def tool_ping_subject(tenant: str, worker: str) -> str:
    """Where a tool worker answers liveness probes (core NATS request/reply):
    ``ratchet.toolping.<tenant>.<worker>``. NATS answers "no responders" at once when
    nobody listens there: the worker a session is pinned to is gone."""
    return f"ratchet.toolping.{check_token(tenant, 'tenant')}.{check_worker_id(worker)}"


def tool_reply_subject(tenant: str, inbox: str) -> str:
    """Where a node awaits its remote tools' replies: ``ratchet.toolreply.<tenant>.<inbox>``
    (core NATS; ``inbox`` is the node's, fresh per process). The tenant is in the subject so
    that NATS permissions can keep one tenant's workers off another's replies."""
    return f"ratchet.toolreply.{check_token(tenant, 'tenant')}.{check_token(inbox, 'inbox')}"


# -- reading subjects (every inbound subject is parsed here, nowhere else) -----------------


def tenant_of(subject: str) -> str:
    """The tenant of ``ratchet.<kind>.<tenant>``: everything after the second dot, "" when
    there is nothing. A subject with more tokens than its kind has yields a value that is
    not a token (``a.b``), which callers refuse with :func:`is_token` / :func:`check_token`
    rather than take its third token for a tenant."""
    parts = subject.split(".", 2)
    return parts[2] if len(parts) == 3 else ""


def request_route(subject: str) -> tuple[str, str]:
    """``(tenant, verb)`` of a request: ``ratchet.<service>.<tenant>.<verb>``, or
    ``ratchet.node.<node>.<service>.<tenant>.<verb>`` for one node; ``("", "")`` if the
    subject is shorter."""
    parts = subject.split(".")
    return (parts[-2], parts[-1]) if len(parts) >= 4 else ("", "")


def tool_reply_route(subject: str) -> str | None:
    """The tenant of a tool reply's subject, ``ratchet.toolreply.<tenant>.<inbox>``; None
    for any other shape."""
    parts = subject.split(".")
    return parts[2] if len(parts) == 4 and parts[1] == "toolreply" else None


def mail_route(subject: str) -> tuple[str, str] | None:
    """``(task_id, actor)`` of actor mail, ``ratchet.mail.<partition>.<task_id>.<actor>``;
    None for any other shape."""
    parts = subject.split(".")
    return (parts[3], parts[4]) if len(parts) == 5 else None
