"""Secrets (docs/security-secrets.md): a ``SecretStr`` of a workflow's input or of a tool's
arguments reaches the step and the tool in clear, is sealed in the SQLite file, and is
redacted wherever it is shown — events on JetStream, logs, handoff packages, admin replies,
the audit. A task reloaded by another node opens it again; a node with the wrong key
refuses to start, saying so.

Each test looks for the secret's bytes in the raw bytes of where it must not be."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import structlog
from pydantic import BaseModel

import ratchet
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import SecretUnreadable
from ratchet.protocol.messages import Envelope
from ratchet.protocol.redaction import LIVE, redact_log_event
from ratchet.protocol.secrets import Sealer
from ratchet.protocol.subjects import STREAM_DLQ, STREAM_EVENTS, dlq_subject, external_subject
from tests import secret_apps
from tests.conftest import RATCHET_BIN, ROOT, NodeFactory, sqlite_only, wait_terminal
from tests.secret_apps import SEEN, SignupInput

REDACTED = ratchet.REDACTED.encode()
OPERATOR = {"name": "olga", "roles": ["operator", "approver"]}


@pytest.fixture(autouse=True)
def _reset_tools() -> None:
    SEEN.clear()
    secret_apps.FLAKY.clear()
    secret_apps.PROMPTS.clear()


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    """Every log line of the test, rendered as JSON into a file: what an operator's log
    would hold. The node adds its redacting processor to this chain as it starts."""
    saved = structlog.get_config()
    path = tmp_path / "log.jsonl"
    with path.open("w") as out:
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(out),
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            cache_logger_on_first_use=False)
        try:
            yield path
        finally:
            structlog.configure(**saved)


def new_secret() -> str:
    return f"sk-live-{secrets.token_hex(12)}"


def db_bytes(state_dir: Path) -> bytes:
    """The raw bytes of the database and its write-ahead log, as a thief would read them."""
    return b"".join(p.read_bytes() for p in sorted(state_dir.glob("ratchet.db*")) if p.is_file())


async def stream_bytes(client: ratchet.Client, stream: str) -> bytes:
    """The raw bytes of every message a JetStream stream holds."""
    info = await client.js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await client.js.get_msg(stream, seq)
        out.append(msg.data or b"")
    return b"".join(out)


async def admin_raw(client: ratchet.Client, verb: str, **body: Any) -> tuple[bytes, dict[str, Any]]:
    """An admin reply's raw bytes, and its decoded map."""
    env = Envelope(type=f"admin.{verb}", message_id=f"m-{verb}", correlation_id=f"m-{verb}",
                   body={"command_id": f"c-{verb}-{body.get('task_id')}",
                         "principal": OPERATOR, **body})
    subject, data = f"ratchet.admin.{client.tenant}.{verb}", encode(env)
    msg = await client.nc.request(subject, data, timeout=10.0,
                                  headers=client.sign(subject, data))
    reply = msgpack.unpackb(msg.data)
    assert reply["ok"], reply
    return msg.data, reply["result"]


async def until(client: ratchet.Client, task_id: str, types: set[str],
                timeout: float = 30.0) -> list[ratchet.Event]:
    """The task's events up to the first of ``types`` (bounded)."""
    events: list[ratchet.Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id, follow_terminal=True):
            events.append(event)
            if event.type in types:
                return

    await asyncio.wait_for(collect(), timeout)
    return events


def signup_input(secret: str, customer: str = "c1") -> SignupInput:
    return SignupInput(customer=customer, api_key=ratchet.SecretStr(secret))


@sqlite_only("it scans the SQLite file and its WAL for the secret bytes")
async def test_a_secret_input_reaches_the_tool_in_clear_and_no_stored_or_shown_bytes(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path, log_file: Path,
) -> None:
    secret = new_secret()
    secret_apps.FLAKY.add(secret)  # its first call fails with an error quoting the token
    node = await start_node(secret_apps.app)
    task_id = (await client.submit("signup", signup_input(secret), key="k1")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded", events[-1]
    assert SEEN == [("charge", secret), ("charge", secret)]  # the tool got the clear value
    retry = next(e for e in events if e.type == "action.retry")
    assert retry.payload["error"]["message"] == f"HTTP 503 for Authorization: Bearer {ratchet.REDACTED}"
    assert events[-1].payload["output"] == {"paid": "ch-c1", "receipt": ratchet.REDACTED}
    # Stored sealed, and readable with the node's key.
    assert node.store is not None
    state = (await node.store.load_state(task_id)).values
    assert state["key"].get_secret_value() == secret
    assert state["receipt"].get_secret_value() == f"rcpt-{secret}"
    [action] = await node.store.task_actions(task_id)
    assert action.args["token"].get_secret_value() == secret
    assert action.result["receipt"].get_secret_value() == f"rcpt-{secret}"
    session = await node.store.session_state(task_id, "default")
    assert session["token"].get_secret_value() == secret
    # Sealing is deterministic: the unchanged secret is written at one checkpoint, not three.
    with sqlite3.connect(f"file:{tmp_path / 'node' / 'ratchet.db'}?mode=ro", uri=True) as db:
        writes = db.execute("SELECT COUNT(*) FROM checkpoint_values WHERE task_id = ?"
                            " AND key = 'key'", (task_id,)).fetchone()[0]
    assert writes == 1
    get, _ = await admin_raw(client, "get", task_id=task_id)
    history, shown = await admin_raw(client, "history", task_id=task_id)
    assert len(shown["events"]) == len(events)
    places = {"events stream": await stream_bytes(client, STREAM_EVENTS), "admin get": get,
              "admin history": history, "sqlite while running": db_bytes(tmp_path / "node")}
    await node.stop()
    places["sqlite after stop"] = db_bytes(tmp_path / "node")
    places["logs"] = log_file.read_bytes()
    assert b"preparing" in places["logs"] and b"calling the provider with" in places["logs"]
    for where, data in places.items():
        assert secret.encode() not in data, where
    assert REDACTED in places["logs"] and REDACTED in places["events stream"]


async def test_an_agent_prompt_quoting_a_secret_reaches_the_model_and_is_kept_sealed(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path, log_file: Path,
) -> None:
    secret = new_secret()
    node = await start_node(secret_apps.app)
    task_id = (await client.submit("signup.agent", signup_input(secret, "c8"), key="k8")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded", events[-1]
    assert secret_apps.PROMPTS[0] == f"Charge c8 with the key {secret}"  # the model's is clear
    assert SEEN == [("charge", secret)]  # the model passed it on to the tool
    assert node.store is not None
    log = await node.store.agent_log(task_id, "clerk#0")
    kind, body = log[0]  # the prompt's message, sealed whole, opened with the node's key
    assert kind == "message" and json.loads(body["sealed"].get_secret_value()) == {
        "role": "user", "content": f"Charge c8 with the key {secret}"}
    places = {"sqlite": db_bytes(tmp_path / "node"), "logs": log_file.read_bytes(),
              "events stream": await stream_bytes(client, STREAM_EVENTS)}
    for where, data in places.items():
        assert secret.encode() not in data, where


async def test_a_handoff_package_shows_the_input_and_requests_redacted(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path,
) -> None:
    secret = new_secret()
    node = await start_node(secret_apps.app)
    task_id = (await client.submit("signup.lost", signup_input(secret), key="k2")).task_id
    events = await until(client, task_id, {"task.unknown"})
    assert SEEN == [("lost", secret)]
    unknown = next(e for e in events if e.type == "action.unknown")
    assert unknown.payload["error"]["message"] == (
        f"connection reset after sending token {ratchet.REDACTED}")
    raw, shown = await admin_raw(client, "handoff", task_id=task_id)
    package = shown["handoffs"][0]["package"]
    assert package["goal"]["input"] == {"customer": "c1", "api_key": ratchet.REDACTED}
    assert package["request"] == {"customer": "c1", "token": ratchet.REDACTED}
    assert package["actions"][0]["request"]["token"] == ratchet.REDACTED
    assert secret.encode() not in raw
    assert node.store is not None
    assert secret.encode() not in msgpack.packb(await node.store.handoffs(task_id))
    assert secret.encode() not in db_bytes(tmp_path / "node")


async def test_an_approval_request_shows_the_secret_redacted_to_its_approver(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path,
) -> None:
    secret = new_secret()
    await start_node(secret_apps.app)
    task_id = (await client.submit("signup.approved", signup_input(secret, "c9"), key="k9")).task_id
    events = await until(client, task_id, {"approval.requested"})
    requested = events[-1].payload
    assert requested["request"] == {"customer": "c9", "key": ratchet.REDACTED}
    decided, _ = await admin_raw(client, "approve", task_id=task_id,
                                 args={"approval_id": requested["approval_id"],
                                       "request_hash": requested["request_hash"]})
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    history, _ = await admin_raw(client, "history", task_id=task_id)
    for where, data in {"approve": decided, "history": history,
                        "sqlite": db_bytes(tmp_path / "node")}.items():
        assert secret.encode() not in data, where


async def test_admin_replies_and_the_audit_of_a_fork_show_no_secret(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path,
) -> None:
    secret, other = new_secret(), new_secret()
    node = await start_node(secret_apps.app)
    task_id = (await client.submit("signup.refused", signup_input(secret), key="k3")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    get, snapshot = await admin_raw(client, "get", task_id=task_id)
    assert ratchet.REDACTED in snapshot["error"]["message"]
    history, _ = await admin_raw(client, "history", task_id=task_id)
    fork, forked = await admin_raw(client, "fork", task_id=task_id, args={
        "checkpoint": 0, "input": {"customer": "c4", "api_key": other}})  # from the start
    events = await wait_terminal(client, forked["task_id"])
    assert SEEN == [("refused", secret), ("refused", other)]  # the fork's new key, in clear
    assert node.store is not None
    audit = await node.store.audit_log("acme")
    requested = [a for a in audit if a["verb"] == "fork" and a["outcome"] == "requested"]
    assert requested[0]["detail"]["args"]["input"] == {"customer": "c4",
                                                       "api_key": ratchet.REDACTED}
    stored = db_bytes(tmp_path / "node")
    for where, data in {"get": get, "history": history, "fork": fork,
                        "audit": msgpack.packb(audit), "sqlite": stored}.items():
        assert secret.encode() not in data and other.encode() not in data, where


@pytest.mark.parametrize("key_from", ["key file", "environment"])
async def test_a_task_reloaded_by_a_restarted_node_gets_the_clear_secret_from_its_checkpoint(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, key_from: str,
) -> None:
    if key_from == "environment":
        monkeypatch.setenv("RATCHET_SECRET_KEY", base64.b64encode(os.urandom(32)).decode())
    secret = new_secret()
    first = await start_node(secret_apps.app)
    task_id = (await client.submit("signup.held", signup_input(secret, "c5"), key="k5")).task_id
    await until(client, task_id, {"wait.started"})
    await first.stop()  # the task is parked; its state lives only in the store
    assert secret.encode() not in db_bytes(tmp_path / "node")
    assert (tmp_path / "node" / "keys" / "secrets.key").exists() == (key_from == "key file")
    await start_node(secret_apps.app)
    env = Envelope(type="external.resolved", message_id="go-c5", correlation_id="go-c5",
                   body={"correlation_id": "go-c5", "outcome": "completed", "result": {}})
    await client.publish_signed(external_subject("acme"), encode(env))
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded", events[-1]
    assert SEEN == [("charge", secret)]


async def test_a_node_with_another_key_or_none_refuses_to_start_with_a_clear_error(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = await start_node(secret_apps.app)
    assert node.store is not None
    [key_id] = await node.store.secret_key_ids()
    task_id = (await client.submit("signup", signup_input(new_secret()), key="k6")).task_id
    await wait_terminal(client, task_id)
    await node.stop()
    other = os.urandom(32)
    monkeypatch.setenv("RATCHET_SECRET_KEY", other.hex())
    with pytest.raises(SecretUnreadable) as wrong:
        await start_node(secret_apps.app)
    assert f"sealed under key {key_id}" in wrong.value.message
    assert Sealer(other).key_id in wrong.value.message
    monkeypatch.delenv("RATCHET_SECRET_KEY")
    (tmp_path / "node" / "keys" / "secrets.key").unlink()
    with pytest.raises(SecretUnreadable) as missing:
        await start_node(secret_apps.app)
    assert missing.value.message.startswith(f"no secret key: this store's secrets are sealed"
                                            f" under key {key_id}")
    assert not (tmp_path / "node" / "keys" / "secrets.key").exists()  # no useless new key
    # `ratchet serve` says it in one line and exits 2, before it even looks for NATS.
    served = await asyncio.create_subprocess_exec(
        str(RATCHET_BIN), "--state-dir", str(tmp_path / "node"), "serve", "--app",
        "tests.secret_apps:app", "--nats-url", "nats://127.0.0.1:9", cwd=ROOT,
        env={**os.environ, "RATCHET_SECRET_KEY": other.hex()},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(served.communicate(), 60)
    assert served.returncode == 2, err
    assert b'"code": "UNAVAILABLE"' in out and key_id.encode() in out


async def test_a_dead_lettered_submit_keeps_its_input_redacted(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path,
) -> None:
    secret = new_secret()
    node = await start_node(secret_apps.app)
    assert node.store is not None
    dlq = await client.nc.subscribe(dlq_subject("submit", "acme"))
    await client.submit("signup", {"api_key": secret}, key="k7")  # no customer: refused
    published = await dlq.next_msg(timeout=20)  # recorded, then published from the outbox
    assert secret.encode() not in published.data
    [letter] = await node.store.dead_letters()
    assert letter["code"] == "INVALID_ARGUMENT"
    assert letter["details"]["problems"] == [{"field": "customer", "problem": "Field required"}]
    assert secret.encode() not in db_bytes(tmp_path / "node")
    assert secret.encode() not in await stream_bytes(client, STREAM_DLQ)


async def test_an_input_model_refuses_a_bad_submission_up_front_and_steps_see_a_map(
    start_node: NodeFactory, client: ratchet.Client,
) -> None:
    class Order(BaseModel):
        item: str
        quantity: int = 1
        card: ratchet.SecretStr

    seen: list[dict[str, Any]] = []
    wf = ratchet.Workflow("order", version=1, input_model=Order)

    @wf.step
    async def look(ctx: ratchet.StepContext) -> dict[str, Any]:
        seen.append(dict(ctx.input))
        return {"output": {"quantity": Order.model_validate(ctx.input).quantity}}

    await start_node(ratchet.Registry([wf]))
    with pytest.raises(ratchet.RemoteError) as refused:
        await client.submit_sync("order", {"item": "pen", "card": 1234567}, key="o1")
    assert refused.value.wire_code == "INVALID_ARGUMENT"
    assert refused.value.details["problems"] == [{"field": "card",
                                                  "problem": "Input should be a valid string"}]
    accepted = await client.submit_sync("order", {"item": "pen", "card": "4111-1111"}, key="o2")
    events = await wait_terminal(client, accepted.task_id)
    assert events[-1].payload["output"] == {"quantity": 1}
    assert seen == [{"item": "pen", "quantity": 1, "card": ratchet.SecretStr("4111-1111")}]
    with pytest.raises(ratchet.WorkflowDefinitionError, match="input_model must be a pydantic"):
        ratchet.Workflow("bad", input_model=dict)  # type: ignore[arg-type]


def test_a_sealed_secret_opens_only_with_its_key_and_only_unaltered() -> None:
    key = os.urandom(32)
    sealed = Sealer(key).pack({"token": ratchet.SecretStr("sk-123456"), "n": 1})
    assert b"sk-123456" not in sealed
    assert sealed == Sealer(key).pack({"token": ratchet.SecretStr("sk-123456"), "n": 1})
    opened = Sealer(key).unpack(sealed)
    assert opened["token"].get_secret_value() == "sk-123456" and opened["n"] == 1
    with pytest.raises(SecretUnreadable, match="cannot be read with key"):
        Sealer(os.urandom(32)).unpack(sealed)
    with pytest.raises(SecretUnreadable, match="cannot be read with no key"):
        Sealer().unpack(sealed)
    altered = bytearray(sealed)
    altered[-12] ^= 1
    with pytest.raises(SecretUnreadable, match="failed authentication"):
        Sealer(key).unpack(bytes(altered))
    with pytest.raises(SecretUnreadable, match="no secret key"):
        Sealer().pack(ratchet.SecretStr("sk-123456"))


def test_the_log_processor_redacts_secret_objects_and_the_live_tasks_clear_values() -> None:
    class Args(BaseModel):
        token: ratchet.SecretStr

    LIVE.add("tsk-x", {"sk-live-abcdef"})
    try:
        event = redact_log_event(None, "info", {
            "event": "calling with sk-live-abcdef", "token": ratchet.SecretStr("hidden-1"),
            "nested": {"list": [ratchet.SecretStr("hidden-2"), "key sk-live-abcdef"]},
            "error": RuntimeError("401 for sk-live-abcdef"), "count": 3})
    finally:
        LIVE.discard("tsk-x")
    assert event == {"event": f"calling with {ratchet.REDACTED}", "token": ratchet.REDACTED,
                     "nested": {"list": [ratchet.REDACTED, f"key {ratchet.REDACTED}"]},
                     "error": f"RuntimeError('401 for {ratchet.REDACTED}')", "count": 3}
    assert redact_log_event(None, "info", {"event": "sk-live-abcdef"}) == {
        "event": "sk-live-abcdef"}  # the task ended: no longer searched for
