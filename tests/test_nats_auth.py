"""NATS authentication and subject permissions (docs/security.md), against a real node
whose embedded nats-server runs with the configuration it wrote from its keyring: anonymous
and unknown keys are refused; each principal's NATS user reaches only its tenant's subjects
for its roles; internal subjects and the streams' API belong to the node; the keyring verbs
change who may connect at once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import msgpack
import nats
import nats.errors
import pytest
import structlog.testing

import ratchet
from ratchet.protocol.auth import Signer, inbox_prefix, new_seed
from ratchet.protocol.catalogue import MessageType, admin_type
from ratchet.protocol.codec import decode_map, encode
from ratchet.protocol.errors import PermissionDenied, Unauthenticated
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import Envelope, GetTask
from ratchet.protocol.subjects import STREAM_EVENTS, STREAM_SUBMIT
from ratchet.supervisors.node.credentials import admin_key_path, node_key_path
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from tests.apps import app
from tests.conftest import RATCHET_BIN, ROOT, assert_contiguous, wait_terminal
from tests.keys import Secured, Spy, issued


def _ratchet(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "error", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60)


async def ratchet_cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a thread: the node under test runs on this event loop."""
    return await asyncio.to_thread(_ratchet, state, *args)


async def _messages(node: ratchet.Node, stream: str) -> int:
    assert node.bus is not None
    return int((await node.bus.js.stream_info(stream)).state.messages)


async def _behind_the_fence(node: ratchet.Node, signer: Signer, subject: str,
                            type_: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request signed by ``signer`` carried by the node's own connection (which NATS
    lets publish anything): what the node's own check answers, NATS's fence aside."""
    assert node.bus is not None
    nc = node.bus.nc
    inbox = f"{inbox_prefix(signer.public_key)}.{new_id('t')}"
    sub = await nc.subscribe(inbox, max_msgs=1)
    env = Envelope(type=type_, message_id=new_id("msg"), correlation_id=new_id("c"), body=body)
    data = encode(env)
    await nc.publish(subject, data, reply=inbox, headers=signer.headers(subject, data,
                                                                        time.time()))
    return decode_map((await sub.next_msg(timeout=10)).data)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_anonymous_connections_and_unknown_keys_are_refused(secured: Secured) -> None:
    with pytest.raises(Unauthenticated):
        await ratchet.Client.connect(secured.url, "acme")
    with pytest.raises(Unauthenticated):
        await ratchet.Client.connect(secured.url, "acme", creds=Signer(new_seed()))
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(secured.url, allow_reconnect=False)


async def test_the_state_dir_is_private_and_so_are_its_database_keys_and_nats_config(
        secured: Secured) -> None:
    state = secured.state
    config = state / "nats" / "nats.conf"
    assert _mode(state) == 0o700
    for path in (state / "ratchet.db", admin_key_path(state), node_key_path(state), config):
        assert _mode(path) == 0o600, path
    text = config.read_text()
    admin = Signer.from_file(admin_key_path(state))
    assert admin.public_key in text and admin.seed.decode() not in text
    assert Signer.from_file(node_key_path(state)).seed.decode() not in text


async def test_a_producer_reaches_only_its_own_tenants_submit_and_api_subjects(
        secured: Secured) -> None:
    producer = await issued(secured.admin, "p", "acme", ["producer"])
    client = await ratchet.Client.connect(secured.url, "acme", creds=producer)
    spy = await Spy.connect(secured.url, producer)
    try:
        task_id = (await client.submit_sync("three", {}, "mine")).task_id
        await wait_terminal(secured.as_tenant("acme"), task_id)
        events, submits = (await _messages(secured.node, STREAM_EVENTS),
                           await _messages(secured.node, STREAM_SUBMIT))
        for subject in ("ratchet.submit.globex", "ratchet.api.globex.get",
                        "ratchet.admin.acme.get", "ratchet.admin.globex.cancel",
                        "ratchet.admin._system.drain", "ratchet.decisions.acme",
                        "ratchet.external.acme", "ratchet.mail.0.tsk_x.task",
                        "ratchet.node.n1.admin.acme.get",
                        f"ratchet.events.acme.{task_id}.task.succeeded",
                        f"$JS.API.STREAM.PURGE.{STREAM_EVENTS}",
                        f"$JS.API.STREAM.DELETE.{STREAM_SUBMIT}",
                        f"$JS.API.CONSUMER.CREATE.{STREAM_EVENTS}.w.ratchet.events.acme.>"):
            await spy.nc.publish(subject, b"{}", reply=spy.nc.new_inbox())
            await spy.refused(subject)
        for subject in ("ratchet.events.acme.>", "ratchet.events.globex.>", "ratchet.mail.>",
                        "_INBOX.>", f"{inbox_prefix(secured.admin.signer.public_key)}.>"):
            await spy.nc.subscribe(subject)
            await spy.refused(subject)
        # Nothing changed: the streams are whole, the node answers.
        assert await _messages(secured.node, STREAM_EVENTS) == events
        assert await _messages(secured.node, STREAM_SUBMIT) == submits
        assert (await client.get(task_id)).status == "SUCCEEDED"
    finally:
        await spy.close()
        await client.close()


async def test_a_subscriber_follows_its_own_tenants_task_and_no_other_tenants(
        secured: Secured) -> None:
    reader = await issued(secured.admin, "r", "acme", ["producer", "subscriber"])
    client = await ratchet.Client.connect(secured.url, "acme", creds=reader)
    spy = await Spy.connect(secured.url, reader)
    try:
        task_id = (await client.submit("three", {}, "mine")).task_id
        events = await wait_terminal(client, task_id)
        assert events[-1].type == "task.succeeded"
        assert_contiguous(events)
        globex = secured.as_tenant("globex")
        theirs = (await globex.submit("three", {}, "theirs")).task_id
        await wait_terminal(globex, theirs)
        nosy = ratchet.Client(client.nc, "globex", reader, client.refusals)
        with pytest.raises(PermissionDenied):
            await asyncio.wait_for(anext(nosy.watch(theirs)), 3)  # told at once
        # A consumer whose config names globex's events through acme's subject: refused by
        # the server, which checks the filter against the subject's.
        for config in ({"filter_subject": "ratchet.events.globex.>"},
                       {"filter_subjects": ["ratchet.events.globex.>"]}):
            request = {"stream_name": STREAM_EVENTS, "config": {
                "name": "w1", "deliver_subject": spy.nc.new_inbox(), "ack_policy": "none",
                **config}}
            answer = await spy.nc.request(
                f"$JS.API.CONSUMER.CREATE.{STREAM_EVENTS}.w1.ratchet.events.acme.>",
                json.dumps(request).encode(), timeout=5)
            assert "error" in json.loads(answer.data), answer.data
        await spy.nc.subscribe(f"ratchet.events.globex.{theirs}.>")
        await spy.refused(f"ratchet.events.globex.{theirs}.>")
    finally:
        await spy.close()
        await client.close()


async def test_ratchet_creds_issues_a_working_key_and_revoke_shuts_it_out(
        secured: Secured, tmp_path: Path) -> None:
    out = tmp_path / "alice.nk"
    made = await ratchet_cli(secured.state, "creds", "--tenant", "acme", "--role", "producer",
                             "--role", "subscriber", "--name", "alice", "--out", str(out))
    assert made.returncode == 0, made.stderr
    alice = Signer.from_file(out)
    assert json.loads(made.stdout) == {
        "name": "alice", "tenant": "acme", "roles": ["producer", "subscriber"],
        "public_key": alice.public_key, "expires_at": None, "file": str(out),
        "inbox_prefix": f"_INBOX.{alice.public_key}"}
    assert _mode(out) == 0o600
    client = await ratchet.Client.connect(secured.url, "acme", creds=out)
    task_id = (await client.submit_sync("three", {}, "a1")).task_id
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    await client.close()
    spy = await Spy.connect(secured.url, alice)  # within its roles only: no admin verb
    await spy.nc.publish("ratchet.admin.acme.get", b"{}", reply=spy.nc.new_inbox())
    await spy.refused("ratchet.admin.acme.get")
    with sqlite3.connect(secured.state / "ratchet.db") as db:
        rows = db.execute("SELECT verb, outcome, detail FROM audit").fetchall()
    assert ("grant", "ok", {"name": "alice", "tenant": "acme", "key": alice.public_key,
                            "roles": ["producer", "subscriber"], "expires_at": None}) in [
        (verb, outcome, msgpack.unpackb(detail)) for verb, outcome, detail in rows]
    assert not any(alice.seed in detail for _, _, detail in rows)  # the node never had it

    revoked = await ratchet_cli(secured.state, "admin", "revoke", "alice", "--tenant", "acme")
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout)["revoked"] == 1
    # The node's check refuses its signature, NATS aside ...
    answer = await _behind_the_fence(secured.node, alice, "ratchet.api.acme.get",
                                     MessageType.TASK_GET, GetTask(task_id=task_id).model_dump())
    assert answer["error"]["code"] == "UNAUTHENTICATED"
    # ... and NATS closed its connection (its user went with the reload) and refuses a new one.
    await asyncio.wait_for(spy.closed.wait(), 10)
    with pytest.raises(Unauthenticated):
        await ratchet.Client.connect(secured.url, "acme", creds=out)


async def test_a_tenant_operator_cannot_grant_keys(secured: Secured) -> None:
    operator = await issued(secured.admin, "o", "acme", ["operator"])
    spy = await Spy.connect(secured.url, operator)
    stranger = Signer(new_seed())
    body = {"command_id": new_id("cmd"), "args": {
        "public_key": stranger.public_key, "name": "me", "tenant": "_system",
        "roles": ["operator"]}}
    try:
        for tenant in ("acme", "_system"):
            subject = f"ratchet.admin.{tenant}.grant"
            await spy.nc.publish(subject, encode(body), reply=spy.nc.new_inbox())
            await spy.refused(subject)
            # Behind NATS's fence, the node refuses it too.
            answer = await _behind_the_fence(secured.node, operator, subject,
                                             admin_type("grant"), body)
            assert answer["error"]["code"] == "PERMISSION_DENIED", answer
        keys = await secured.admin.request_admin("keys", {"command_id": new_id("cmd")})
        assert stranger.public_key not in {k["public_key"] for k in keys["keys"]}
    finally:
        await spy.close()


async def test_a_key_that_expires_is_shut_out_of_nats_at_the_next_tick(
        secured: Secured) -> None:
    brief = await issued(secured.admin, "brief", "acme", ["producer"], expires_in_s=1.0)
    client = await ratchet.Client.connect(secured.url, "acme", creds=brief)
    await client.close()

    async def refused() -> None:
        while True:
            try:
                again = await ratchet.Client.connect(secured.url, "acme", creds=brief)
            except Unauthenticated:
                return
            await again.close()
            await asyncio.sleep(0.1)  # pacing: the node's lease tick rewrites the users

    await asyncio.wait_for(refused(), 10)


async def test_the_keys_verb_lists_the_keyring_and_grant_validates_its_arguments(
        secured: Secured) -> None:
    listed = await secured.admin.request_admin("keys", {"command_id": new_id("cmd")})
    assert [(k["name"], k["tenant"]) for k in listed["keys"]] == [("local-admin", "_system")]
    node_key = Signer.from_file(node_key_path(secured.state)).public_key
    good = {"public_key": Signer(new_seed()).public_key, "name": "x", "tenant": "acme",
            "roles": ["viewer"]}
    for bad in ({"roles": ["root"]}, {"roles": []}, {"tenant": "a.b"}, {"name": "*"},
                {"public_key": "UNOPE"}, {"public_key": node_key}, {"expires_in_s": -1}):
        with pytest.raises(ratchet.RemoteError) as info:
            await secured.admin.request_admin("grant", {"command_id": new_id("cmd"),
                                                        "args": {**good, **bad}})
        assert info.value.wire_code == "INVALID_ARGUMENT", bad


async def test_a_node_joins_an_external_nats_configured_with_the_block_nats_config_prints(
        tmp_path: Path) -> None:
    state = tmp_path / "node"
    printed = await ratchet_cli(state, "nats-config")
    assert printed.returncode == 0, printed.stderr
    assert "authorization {" in printed.stdout and "local-admin of _system" in printed.stdout
    conf = tmp_path / "server.conf"
    conf.write_text(printed.stdout)
    server = EmbeddedNats(tmp_path / "external", config_file=conf)
    url = await server.start()
    try:
        with pytest.raises(Unauthenticated):
            await ratchet.Client.connect(url, "acme")
        node = ratchet.Node(ratchet.NodeConfig(state_dir=state, nats_url=url,
                                               nats_creds=node_key_path(state)), app)
        await node.start()
        try:
            client = await ratchet.Client.connect(url, "acme", creds=admin_key_path(state))
            task_id = (await client.submit_sync("three", {}, "ext")).task_id
            assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
            await client.close()
        finally:
            await node.stop()
    finally:
        await server.stop()


async def test_a_nats_password_never_reaches_the_logs_or_admin_nodes(tmp_path: Path) -> None:
    conf = tmp_path / "password.conf"
    conf.write_text('authorization { users = [ { user: ratchet, password: "s3cret-pw" } ] }\n')
    server = EmbeddedNats(tmp_path / "external", config_file=conf)
    host = (await server.start()).removeprefix("nats://")
    url = f"nats://ratchet:s3cret-pw@{host}"
    state = tmp_path / "node"
    try:
        node = ratchet.Node(ratchet.NodeConfig(state_dir=state, nats_url=url), app)
        with structlog.testing.capture_logs() as logs:
            await node.start()
        try:
            admin = await ratchet.Client.connect(url, "_system", creds=admin_key_path(state))
            nodes = await admin.request_admin("nodes", {"command_id": new_id("cmd")})
            await admin.close()
        finally:
            await node.stop()
        assert nodes["nodes"][0]["info"]["url"] == f"nats://ratchet:***@{host}"
        assert "s3cret-pw" not in json.dumps(nodes) and "s3cret-pw" not in repr(logs)
        assert any(e.get("url") == f"nats://ratchet:***@{host}" for e in logs)
    finally:
        await server.stop()
