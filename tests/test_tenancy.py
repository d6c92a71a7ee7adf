"""Tenancy with real nkey users: a node's embedded nats-server runs with the users it wrote
from its keyring (a key of acme's, a key of globex's); a tenant cannot publish on another
tenant's subjects nor listen to its replies or events (the server refuses), naming
another tenant's task through its own subjects gets NOT_FOUND, and a reply subject that
names another tenant's events makes the node publish nothing there."""

from __future__ import annotations

import asyncio

import pytest

import ratchet
from ratchet.protocol.auth import inbox_prefix
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.codec import encode
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.messages import Envelope, GetTask
from ratchet.protocol.subjects import STREAM_EVENTS
from tests.conftest import wait_terminal
from tests.keys import Secured, Spy, issued

ROLES = ["producer", "subscriber", "viewer"]


async def test_a_tenant_cannot_reach_another_tenants_subjects(secured: Secured) -> None:
    acme = await ratchet.Client.connect(
        secured.url, "acme", creds=await issued(secured.admin, "shop", "acme", ROLES))
    globex_key = await issued(secured.admin, "shop", "globex", ROLES)
    globex = await ratchet.Client.connect(secured.url, "globex", creds=globex_key)
    spy = await Spy.connect(secured.url, globex_key)
    try:
        accepted = await acme.submit_sync("three", {}, key="mine")
        task_id = accepted.task_id
        assert task_id == task_id_for("acme", "mine")
        assert (await wait_terminal(acme, task_id))[-1].type == "task.succeeded"
        body = {"command_id": new_id("cmd"), "task_id": task_id}
        # The server refuses globex's publish on acme's subjects: the node never sees it.
        for subject in ("ratchet.admin.acme.get", "ratchet.api.acme.get", "ratchet.submit.acme"):
            await spy.nc.publish(subject, encode(body), reply=spy.nc.new_inbox())
            await spy.refused(subject)
        # Through its own subjects, acme's task does not exist for globex.
        with pytest.raises(ratchet.RemoteError) as info:
            await globex.request_admin("get", {**body, "command_id": new_id("cmd")})
        assert info.value.wire_code == "NOT_FOUND"
        mine = await acme.request_admin("get", {**body, "command_id": new_id("cmd")})
        assert mine["status"] == "SUCCEEDED"
    finally:
        await spy.close()
        await acme.close()
        await globex.close()


async def test_a_tenant_cannot_listen_to_another_tenants_replies_or_events(
        secured: Secured) -> None:
    acme_key = await issued(secured.admin, "shop", "acme", ROLES)
    spy = await Spy.connect(secured.url, await issued(secured.admin, "shop", "globex", ROLES))
    try:
        for subject in (f"{inbox_prefix(acme_key.public_key)}.>", "_INBOX.>",
                        "ratchet.events.acme.>", "ratchet.events.>", "ratchet.mail.>"):
            await spy.nc.subscribe(subject)
            await spy.refused(subject)
    finally:
        await spy.close()


async def test_a_reply_subject_in_another_tenants_events_makes_the_node_publish_nothing(
        secured: Secured) -> None:
    """The confused deputy: globex asks for its own task with a reply subject in acme's
    event stream. The node, which may publish anywhere, answers only under the signer's
    own inbox: acme's events stay as they were and acme's watch still ends well."""
    acme = await ratchet.Client.connect(
        secured.url, "acme", creds=await issued(secured.admin, "shop", "acme", ROLES))
    globex_key = await issued(secured.admin, "shop", "globex", ROLES)
    globex = await ratchet.Client.connect(secured.url, "globex", creds=globex_key)
    try:
        task_id = (await acme.submit("three", {}, key="target")).task_id
        await wait_terminal(acme, task_id)
        theirs = (await globex.submit("three", {}, key="own")).task_id
        await wait_terminal(globex, theirs)
        assert secured.node.bus is not None
        before = (await secured.node.bus.js.stream_info(STREAM_EVENTS)).state.messages
        assert (await globex.get(theirs)).status == "SUCCEEDED"  # its key is known now
        subject = "ratchet.api.globex.get"
        env = Envelope(type=MessageType.TASK_GET, message_id=new_id("msg"),
                       correlation_id=new_id("c"), body=GetTask(task_id=theirs).model_dump())
        data = encode(env)
        await globex.nc.publish(subject, data,
                                reply=f"ratchet.events.acme.{task_id}.task.succeeded",
                                headers=globex.sign(subject, data))
        # A request it answers, behind the forged one on the same connection: once that is
        # answered, the forged one was refused too (handled in order; the key is cached,
        # so refusing it waits on nothing).
        assert (await globex.get(theirs)).status == "SUCCEEDED"
        after = (await secured.node.bus.js.stream_info(STREAM_EVENTS)).state.messages
        assert after == before
        events = await asyncio.wait_for(wait_terminal(acme, task_id), 20)
        assert events[-1].type == "task.succeeded"
    finally:
        await acme.close()
        await globex.close()
