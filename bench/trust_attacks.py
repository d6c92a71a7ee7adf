"""The attacks of issue 12, each as an attacker would try it against a real node, each
judged by its effect (a task's status or events, a stream's contents, a file's mode), not
by the reply. Each returns True when the attack succeeded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

import ratchet
from bench.trust_range import Range, envelope
from ratchet.protocol.catalogue import MessageType, admin_type
from ratchet.protocol.codec import decode_map
from ratchet.protocol.ids import new_id
from ratchet.protocol.subjects import STREAM_EVENTS, mail_subject

__all__ = ["ATTACKS"]

Attack = Callable[[Range], Awaitable[bool]]
ATTACKS: dict[str, Attack] = {}


def attack(fn: Attack) -> Attack:
    ATTACKS[fn.__name__] = fn
    return fn


async def _request(nc: NATS, subject: str, data: bytes, headers: dict[str, str] | None = None,
                   timeout: float = 2.0) -> Msg | None:
    try:
        return await nc.request(subject, data, timeout=timeout, headers=headers)
    except Exception:  # refused by the server (no responders, permissions) or no answer
        return None


async def _js_publish(client: ratchet.Client, subject: str, data: bytes,
                      headers: dict[str, str] | None = None) -> bool:
    try:
        await client.js.publish(subject, data, headers=headers, timeout=2.0)
        return True
    except Exception:
        return False


def _admin_body(task_id: str | None = None, **args: Any) -> dict[str, Any]:
    return {"command_id": new_id("cmd"), "task_id": task_id, "args": args,
            "principal": {"name": "mallory", "roles": ["approver", "operator", "viewer"]}}


async def _still(rng: Range, task_id: str, status: str, settle: float = 1.5) -> bool:
    """True if the task left ``status`` (the attack changed it) within ``settle`` s."""
    await asyncio.sleep(settle)  # the effect, if any, has had time to land
    return await rng.status(task_id) != status


@attack
async def anonymous_connection(rng: Range) -> bool:
    nc = await rng.anonymous()
    if nc is None:
        return False
    await nc.close()
    return True


@attack
async def files_readable_by_others(rng: Range) -> bool:
    paths = [rng.state_dir, rng.state_dir / "ratchet.db", *(rng.state_dir / "keys").iterdir()]
    return any(os.stat(p).st_mode & (stat.S_IRWXG | stat.S_IRWXO) for p in paths)


@attack
async def claimed_roles_in_payload(rng: Range) -> bool:
    task_id, asked = await rng.parked_payment("claimed")
    viewer = rng.clients["acme-viewer"]
    try:
        await viewer.request_admin("approve", _admin_body(task_id,
                                                          approval_id=asked["approval_id"]))
    except Exception:
        pass
    return await _still(rng, task_id, "WAITING_APPROVAL")


@attack
async def unsigned_approve(rng: Range) -> bool:
    task_id, asked = await rng.parked_payment("unsigned")
    nc = rng.clients["acme-approver"].nc
    data = envelope(admin_type("approve"), _admin_body(task_id, approval_id=asked["approval_id"]))
    await _request(nc, "ratchet.admin.acme.approve", data)
    return await _still(rng, task_id, "WAITING_APPROVAL")


@attack
async def tenant_operator_drains_the_cluster(rng: Range) -> bool:
    op = rng.clients["globex-operator"]
    system = ratchet.Client(rng.admin.nc, "_system", rng.admin.signer)
    nodes = (await system.request_admin("nodes", {"command_id": new_id("cmd")}))["nodes"]
    for node in nodes:
        data = envelope(admin_type("drain"), _admin_body(None, node=node["node_id"]))
        subject = "ratchet.admin._system.drain"
        await _request(op.nc, subject, data, headers=op.sign(subject, data))
    listed = await system.request_admin("nodes", {"command_id": new_id("cmd")})
    return any(n.get("status") != "active" for n in listed["nodes"])


@attack
async def tenant_freeze_stops_other_tenants(rng: Range) -> bool:
    op = rng.clients["globex-operator"]
    try:
        await op.request_admin("freeze", _admin_body(None, reason="mine"))
    except Exception:
        pass
    try:
        task_id = (await rng.clients["acme-producer"].submit("quick", {}, key="freeze-probe")).task_id
        await rng.wait_for(task_id, {"task.succeeded"}, timeout=10.0)
        return False
    except TimeoutError:
        return True
    finally:
        try:
            await op.request_admin("thaw", _admin_body(None))
        except Exception:
            pass


@attack
async def read_other_tenants_events(rng: Range) -> bool:
    spy = rng.clients["globex-producer"]
    seen: list[str] = []

    async def got(msg: Msg) -> None:
        seen.append(msg.subject)

    for subject in ("ratchet.events.>", "ratchet.events.acme.>"):
        try:
            await spy.nc.subscribe(subject, cb=got)
        except Exception:
            pass
    task_id = (await rng.clients["acme-producer"].submit("quick", {}, key="spied")).task_id
    await rng.wait_for(task_id, {"task.succeeded"})
    await asyncio.sleep(0.5)
    return any(".acme." in s for s in seen)


async def _js_api(rng: Range, subject: str) -> None:
    await _request(rng.clients["globex-producer"].nc, subject, b"")


async def _stream_messages(rng: Range, stream: str) -> int | None:
    try:
        info = await rng.observer.js.stream_info(stream)
    except Exception:
        return None
    return int(info.state.messages)


@attack
async def purge_the_events_stream(rng: Range) -> bool:
    before = await _stream_messages(rng, STREAM_EVENTS)
    assert before, "the range sees the events stream"  # else the check proves nothing
    await _js_api(rng, f"$JS.API.STREAM.PURGE.{STREAM_EVENTS}")
    after = await _stream_messages(rng, STREAM_EVENTS)
    return after is None or (before is not None and after < before)


@attack
async def delete_the_submit_stream(rng: Range) -> bool:
    await _js_api(rng, "$JS.API.STREAM.DELETE.RATCHET_SUBMIT")
    return await _stream_messages(rng, "RATCHET_SUBMIT") is None


@attack
async def delete_the_mail_stream(rng: Range) -> bool:
    await _js_api(rng, "$JS.API.STREAM.DELETE.RATCHET_MAIL")
    return await _stream_messages(rng, "RATCHET_MAIL") is None


async def _forge_mail(rng: Range, task_id: str, type_: str, body: dict[str, Any]) -> None:
    client = rng.clients["acme-producer"]
    await _js_publish(client, mail_subject(task_id, "task"), envelope(type_, body))


@attack
async def forged_mail_approval(rng: Range) -> bool:
    task_id, asked = await rng.parked_payment("forged-decision")
    await _forge_mail(rng, task_id, MessageType.APPROVAL_DECISION, {
        "task_id": task_id, "approval_id": asked["approval_id"], "decision": "approve",
        "decided_by": "mallory"})
    return await _still(rng, task_id, "WAITING_APPROVAL")


@attack
async def forged_mail_cancel(rng: Range) -> bool:
    task_id, _ = await rng.parked_payment("forged-cancel")
    await _forge_mail(rng, task_id, MessageType.TASK_CONTROL,
                      {"action": "cancel", "request": {"by": "mallory"}})
    return await _still(rng, task_id, "WAITING_APPROVAL")


@attack
async def forged_mail_approval_timeout(rng: Range) -> bool:
    task_id, asked = await rng.parked_payment("forged-timeout")
    await _forge_mail(rng, task_id, MessageType.TIMER_FIRED, {
        "kind": "approval_timeout", "approval_id": asked["approval_id"]})
    return await _still(rng, task_id, "WAITING_APPROVAL")


@attack
async def forged_mail_external_resolved(rng: Range) -> bool:
    task_id = await rng.parked_shipment(901)
    await _forge_mail(rng, task_id, MessageType.EXTERNAL_RESOLVED, {
        "correlation_id": "order-901", "outcome": "completed", "result": {"forged": True}})
    return await _still(rng, task_id, "WAITING_EXTERNAL")


@attack
async def confirmation_from_another_tenant(rng: Range) -> bool:
    task_id = await rng.parked_shipment(902)
    globex = rng.clients["globex-operator"]
    data = envelope(MessageType.EXTERNAL_RESOLVED, {"correlation_id": "order-902",
                                                    "outcome": "completed", "result": {}})
    await globex.publish_signed("ratchet.external.globex", data)
    return await _still(rng, task_id, "WAITING_EXTERNAL", settle=3.0)


@attack
async def unsigned_confirmation(rng: Range) -> bool:
    task_id = await rng.parked_shipment(903)
    data = envelope(MessageType.EXTERNAL_RESOLVED, {"correlation_id": "order-903",
                                                    "outcome": "completed", "result": {}})
    await _js_publish(rng.clients["acme-confirmer"], "ratchet.external.acme", data)
    return await _still(rng, task_id, "WAITING_EXTERNAL", settle=3.0)


@attack
async def decision_on_another_tenants_subject(rng: Range) -> bool:
    task_id, asked = await rng.parked_payment("cross-decision")
    globex = rng.clients["globex-operator"]  # an approver, of globex
    data = envelope(MessageType.APPROVAL_DECISION, {
        "task_id": task_id, "approval_id": asked["approval_id"], "decision": "approve"})
    await globex.publish_signed("ratchet.decisions.globex", data)
    return await _still(rng, task_id, "WAITING_APPROVAL", settle=3.0)


async def _deputy(rng: Range, send: Callable[[str], Awaitable[None]]) -> bool:
    """Whether the node published on ``target`` (acme's event subject) for globex."""
    task_id = (await rng.clients["acme-producer"].submit("quick", {}, key=new_id("deputy"))).task_id
    await rng.wait_for(task_id, {"task.succeeded"})
    target = f"ratchet.events.acme.{task_id}.task.succeeded"
    landed: list[bytes] = []

    async def got(msg: Msg) -> None:
        landed.append(msg.data)

    sub = await rng.admin.nc.subscribe(target, cb=got)
    await rng.admin.nc.flush()
    await send(target)
    await asyncio.sleep(1.5)
    await sub.unsubscribe()
    return bool(landed)


@attack
async def confused_deputy_reply_subject(rng: Range) -> bool:
    spy = rng.clients["globex-producer"]

    async def send(target: str) -> None:
        subject = "ratchet.api.globex.get"
        data = envelope(MessageType.TASK_GET, {"task_id": "tsk_none"})
        await spy.nc.publish(subject, data, reply=target, headers=spy.sign(subject, data))

    return await _deputy(rng, send)


@attack
async def confused_deputy_submit_reply_to(rng: Range) -> bool:
    spy = rng.clients["globex-producer"]

    async def send(target: str) -> None:
        data = envelope(MessageType.TASK_SUBMIT, {"workflow": "quick", "input": {},
                                                  "idempotency_key": new_id("k")},
                        reply_to=target)
        await _js_publish(spy, "ratchet.submit.globex", data)

    return await _deputy(rng, send)


@attack
async def secrets_in_replies_and_lines(rng: Range) -> bool:
    system = ratchet.Client(rng.admin.nc, "_system", rng.admin.signer)
    listed = await system.request_admin("nodes", {"command_id": new_id("cmd")})
    seed_text = b"".join(p.read_bytes() for p in rng.keys.values())
    shown = repr(listed).encode()
    return b"password" in shown or any(s in shown for s in seed_text.split()) \
        or "@" in rng.url


@attack
async def replayed_signed_request(rng: Range) -> bool:
    task_id, _ = await rng.parked_payment("replayed")
    viewer = rng.clients["acme-viewer"]
    subject = "ratchet.admin.acme.get"
    data = envelope(admin_type("get"), {"command_id": new_id("cmd"), "task_id": task_id})
    headers = viewer.sign(subject, data)
    first = await _request(viewer.nc, subject, data, headers)
    again = await _request(viewer.nc, subject, data, headers)
    if first is None or again is None:
        return again is not None and first is None
    return bool(decode_map(again.data).get("ok"))


@attack
async def stale_signature(rng: Range) -> bool:
    viewer = rng.clients["acme-viewer"]
    assert viewer.signer is not None
    subject = "ratchet.admin.acme.list"
    data = envelope(admin_type("list"), {"command_id": new_id("cmd")})
    headers = viewer.signer.headers(subject, data, time.time() - 3600)
    reply = await _request(viewer.nc, subject, data, headers)
    return reply is not None and bool(decode_map(reply.data).get("ok"))


@attack
async def tenant_operator_grants_itself_system(rng: Range) -> bool:
    op = rng.clients["globex-operator"]
    assert op.signer is not None
    subject = "ratchet.admin._system.grant"
    data = envelope(admin_type("grant"), {"command_id": new_id("cmd"), "args": {
        "public_key": op.signer.public_key, "name": "root2", "tenant": "_system",
        "roles": ["operator"]}})
    reply = await _request(op.nc, subject, data, op.sign(subject, data))
    return reply is not None and bool(decode_map(reply.data).get("ok"))


@attack
async def revoked_key(rng: Range) -> bool:
    revoked = rng.cli("admin", "revoke", "acme-viewer", "--tenant", "acme")
    if revoked.returncode != 0:
        raise RuntimeError(f"revoke failed: {revoked.stdout} {revoked.stderr}")
    await rng.keyring_changed()
    viewer = rng.clients["acme-viewer"]
    # The server's reload closes the revoked key's connection: wait for that (bounded),
    # then judge with a fresh connection and a signed request.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            while viewer.nc.is_connected:  # noqa: ASYNC110 - the server's doing
                await asyncio.sleep(0.05)
    subject = "ratchet.admin.acme.list"
    data = envelope(admin_type("list"), {"command_id": new_id("cmd")})
    reply = await _request(viewer.nc, subject, data, viewer.sign(subject, data))
    if reply is not None and decode_map(reply.data).get("ok"):
        return True
    return await rng.connects_with(rng.keys["acme-viewer"])


@attack
async def audit_rows_edited(rng: Range) -> bool:
    """Last: it breaks the chain on purpose. Undetected if verify-audit says ok."""
    db = sqlite3.connect(rng.state_dir / "ratchet.db")
    try:
        db.execute("UPDATE audit SET principal = 'mallory' WHERE seq = 2")
        db.commit()
    finally:
        db.close()
    checked = rng.cli("admin", "verify-audit")
    return checked.returncode == 0
