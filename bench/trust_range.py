"""The range bench/trust.py attacks: a real ``ratchet serve`` (embedded NATS, generated
credentials), principals issued with ``ratchet creds``, and helpers that observe effects
(task statuses and events) rather than believe replies."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

import ratchet
from bench.steps import RATCHET_BIN, ROOT, NodeProc
from ratchet.protocol.codec import encode
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import Envelope
from ratchet.supervisors.node.credentials import admin_key_path, node_key_path

__all__ = ["Range", "PRINCIPALS"]

#: name → (tenant, roles): who the range issues credentials to.
PRINCIPALS: dict[str, tuple[str, list[str]]] = {
    "acme-producer": ("acme", ["producer"]),
    "acme-subscriber": ("acme", ["subscriber"]),
    "acme-viewer": ("acme", ["viewer"]),
    "acme-operator": ("acme", ["operator"]),
    "acme-approver": ("acme", ["approver"]),
    "acme-confirmer": ("acme", ["confirmer"]),
    "globex-producer": ("globex", ["producer", "subscriber"]),
    "globex-operator": ("globex", ["operator", "approver", "confirmer"]),
}


@dataclass
class Range:
    state_dir: Path
    app: str = "bench.trust_app:app"
    node: NodeProc | None = None
    keys: dict[str, Path] = field(default_factory=dict)
    issued: Callable[[], Awaitable[None]] | None = None
    clients: dict[str, ratchet.Client] = field(default_factory=dict)

    @property
    def url(self) -> str:
        assert self.node is not None and self.node.url is not None
        return self.node.url

    async def start(self, nats_url: str | None = None, args: tuple[str, ...] = (),
                    issued: Callable[[], Awaitable[None]] | None = None) -> None:
        """``issued``: called once every key is granted, before any connects with them
        (a NATS of one's own reloads its users then)."""
        self.node = NodeProc(self.state_dir, nats_url, app=self.app, args=args)
        await asyncio.to_thread(self.node.start)
        for name, (tenant, roles) in PRINCIPALS.items():
            self.keys[name] = self.issue(name, tenant, roles)
        self.issued = issued
        await self.keyring_changed()
        self.admin = await ratchet.Client.connect(self.url, "acme",
                                                  creds=admin_key_path(self.state_dir))
        # The range's own eyes on the streams: the node's key (only nodes may use the
        # streams' JetStream API), never lent to an attack.
        self.observer = await ratchet.Client.connect(
            self.url, "_system", creds=node_key_path(self.state_dir))
        for name, (tenant, _) in PRINCIPALS.items():
            self.clients[name] = await ratchet.Client.connect(self.url, tenant,
                                                              creds=self.keys[name])

    async def keyring_changed(self) -> None:
        """What an operator does after ``ratchet creds`` or a revoke: nothing with the
        embedded server (the node reloads it); with one's own, re-run nats-config and
        reload it (docs/security.md)."""
        if self.issued is not None:
            await self.issued()

    def issue(self, name: str, tenant: str, roles: list[str]) -> Path:
        """``ratchet creds``, as an operator on the node's machine runs it."""
        out = self.state_dir.parent / f"{name}.nk"
        cmd = [str(RATCHET_BIN), "--state-dir", str(self.state_dir), "--log-level",
               "warning", "creds", "--tenant", tenant, "--name", name, "--out", str(out),
               "--nats-url", self.url]
        for role in roles:
            cmd += ["--role", role]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"ratchet creds failed: {done.stdout} {done.stderr}")
        return out

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(RATCHET_BIN), "--state-dir", str(self.state_dir),
                               "--log-level", "warning", *args, "--nats-url", self.url],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    async def stop(self) -> None:
        for client in [*self.clients.values(), self.admin, self.observer]:
            try:
                await client.close()
            except Exception:  # a connection the attacks broke on purpose
                pass
        if self.node is not None and self.node.proc is not None:
            self.node.proc.terminate()
            await asyncio.to_thread(self.node.proc.wait, 30)

    # -- observing effects ----------------------------------------------------------------

    async def status(self, task_id: str) -> str:
        return (await self.admin.get(task_id)).status

    async def events(self, task_id: str, tenant: str = "acme") -> list[dict[str, Any]]:
        admin = ratchet.Client(self.admin.nc, tenant, self.admin.signer)
        reply = await admin.request_admin("history", {"command_id": new_id("cmd"),
                                                      "task_id": task_id,
                                                      "args": {"limit": 1000}})
        return list(reply["events"])

    async def wait_for(self, task_id: str, types: set[str], timeout: float = 20.0,
                       tenant: str = "acme") -> dict[str, Any]:
        """The first event of ``types`` of the task (bounded wait on the stream)."""
        client = ratchet.Client(self.admin.nc, tenant, self.admin.signer)
        async with asyncio.timeout(timeout):
            async for event in client.watch(task_id, follow_terminal=True):
                if event.type in types:
                    return event.model_dump()
        raise TimeoutError(task_id)

    async def parked_payment(self, key: str, amount: int = 100) -> tuple[str, dict[str, Any]]:
        producer = self.clients["acme-producer"]
        task_id = (await producer.submit("payment", {"amount": amount}, key=key)).task_id
        event = await self.wait_for(task_id, {"approval.requested"})
        return task_id, event["payload"]

    async def parked_shipment(self, order: int) -> str:
        task_id = (await self.clients["acme-producer"].submit("ship", {"order": order},
                                                             key=f"ship-{order}")).task_id
        await self.wait_for(task_id, {"wait.started"})
        return task_id

    async def connects_with(self, key: Path) -> bool:
        """Whether NATS still lets the holder of ``key`` connect (a revoked key: not)."""
        try:
            client = await ratchet.Client.connect(self.url, "acme", creds=key)
        except Exception:
            return False
        await client.close()
        return True

    async def anonymous(self) -> NATS | None:
        try:
            return await nats.connect(self.url, allow_reconnect=False, connect_timeout=2,
                                      max_reconnect_attempts=0)
        except Exception:
            return None


def envelope(type_: str, body: dict[str, Any], **extra: Any) -> bytes:
    mid = new_id("msg")
    return encode(Envelope(type=type_, message_id=mid, correlation_id=mid, body=body,
                           **extra))


def read_json_line(text: str) -> dict[str, Any]:
    return dict(json.loads(text.strip().splitlines()[-1]))
