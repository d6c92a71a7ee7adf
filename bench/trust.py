"""Every attack of issue 12 (and a few more) against a real ``ratchet serve``, then the same
operations done with the right credentials. Prints one JSON object (last line):

- ``attacks_tried`` / ``attacks_succeeded`` (must be 0) / ``succeeded`` (their names);
- ``legit_ops`` / ``legit_ops_ok`` (each must succeed) / ``legit_failed``;
- per configuration: ``default`` (``ratchet serve`` with its embedded NATS and generated
  credentials) and ``tenants`` (a standalone nats-server with the authorization block
  ``ratchet nats-config`` prints, the node joining it with its own key).

Each attack is judged by its effect — a task's status, a stream's contents, a file's mode,
a message landing on a subject — never by the reply it got (bench/trust_attacks.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.steps import RATCHET_BIN
from bench.trust_attacks import ATTACKS
from bench.trust_range import Range, envelope
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.ids import new_id
from ratchet.supervisors.cli import configure_logging
from ratchet.supervisors.node.credentials import node_key_path
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

Op = Callable[[Range], Awaitable[bool]]
LEGIT: dict[str, Op] = {}


def legit(fn: Op) -> Op:
    LEGIT[fn.__name__] = fn
    return fn


@legit
async def approver_approves_a_payment(rng: Range) -> bool:
    task_id, asked = await rng.parked_payment("legit-pay", amount=42)
    await rng.clients["acme-approver"].decide(task_id, asked["approval_id"], "approve")
    done = await rng.wait_for(task_id, {"task.succeeded", "task.failed"})
    return bool(done["type"] == "task.succeeded" and done["payload"]["output"] == {"paid": 42})


@legit
async def confirmer_confirms_a_shipment(rng: Range) -> bool:
    task_id = await rng.parked_shipment(7)
    data = envelope(MessageType.EXTERNAL_RESOLVED, {"correlation_id": "order-7",
                                                    "outcome": "completed", "result": {}})
    await rng.clients["acme-confirmer"].publish_signed("ratchet.external.acme", data)
    done = await rng.wait_for(task_id, {"task.succeeded", "task.failed"})
    return bool(done["type"] == "task.succeeded")


@legit
async def subscriber_follows_its_tenants_task(rng: Range) -> bool:
    task_id = (await rng.clients["acme-producer"].submit("quick", {}, key="legit-watch")).task_id
    types = []
    async with asyncio.timeout(20):
        async for event in rng.clients["acme-subscriber"].watch(task_id):
            types.append(event.type)
    return types[-1] == "task.succeeded"


@legit
async def viewer_reads_and_operator_cancels(rng: Range) -> bool:
    task_id, _ = await rng.parked_payment("legit-cancel")
    seen = await rng.clients["acme-viewer"].request_admin(
        "get", {"command_id": new_id("cmd"), "task_id": task_id})
    await rng.clients["acme-operator"].request_admin(
        "cancel", {"command_id": new_id("cmd"), "task_id": task_id, "args": {"reason": "t"}})
    done = await rng.wait_for(task_id, {"task.cancelled"})
    return seen["status"] == "WAITING_APPROVAL" and done["payload"]["by"] == "acme-operator"


@legit
async def producer_submits_and_reads_its_own(rng: Range) -> bool:
    globex = rng.clients["globex-producer"]
    accepted = await globex.submit_sync("quick", {}, key="legit-globex")
    snapshot = await globex.get(accepted.task_id)
    return snapshot.tenant == "globex"


@legit
async def tenant_operator_freezes_and_thaws_its_tenant(rng: Range) -> bool:
    op = rng.clients["globex-operator"]
    await op.request_admin("freeze", {"command_id": new_id("cmd"), "args": {"reason": "t"}})
    await op.request_admin("thaw", {"command_id": new_id("cmd")})
    return True


@legit
async def local_admin_lists_nodes_and_verifies_the_audit(rng: Range) -> bool:
    nodes = rng.cli("admin", "nodes")
    checked = rng.cli("admin", "verify-audit")
    return nodes.returncode == 0 and checked.returncode == 0


async def _run(rng: Range) -> dict[str, Any]:
    results: dict[str, Any] = {"legit": {}, "attacks": {}}
    for name, op in LEGIT.items():  # first: some attacks revoke keys or break the audit
        try:
            results["legit"][name] = await asyncio.wait_for(op(rng), 60)
        except Exception as exc:
            results["legit"][name] = f"error: {exc!r}"[:200]
    for name, attack in ATTACKS.items():
        try:
            results["attacks"][name] = await asyncio.wait_for(attack(rng), 60)
        except Exception as exc:  # an attack that could not even be tried counts as failed
            results["attacks"][name] = f"refused: {exc!r}"[:200]
    return results


async def configuration(name: str, tmp: Path) -> dict[str, Any]:
    rng = Range(tmp / name / "state")
    rng.state_dir.parent.mkdir(parents=True)
    server: EmbeddedNats | None = None
    try:
        if name == "default":
            await rng.start()
        else:
            server = await _standalone(rng)
            assert server.url is not None
            await rng.start(server.url, ("--nats-creds", str(node_key_path(rng.state_dir))),
                            issued=lambda: _reload(rng, server))
        return await _run(rng)
    finally:
        await rng.stop()
        if server is not None:
            await server.stop()


async def _standalone(rng: Range) -> EmbeddedNats:
    """A nats-server of one's own, configured with what ``ratchet nats-config`` prints
    for the state dir (its node key and local admin: docs/security.md)."""
    conf = rng.state_dir.parent / "server.conf"
    conf.write_text(_nats_config(rng))
    server = EmbeddedNats(rng.state_dir.parent / "external", config_file=conf)
    await server.start()
    return server


def _nats_config(rng: Range) -> str:
    printed = subprocess.run([str(RATCHET_BIN), "--state-dir", str(rng.state_dir),
                              "--log-level", "warning", "nats-config"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=True)
    return printed.stdout


async def _reload(rng: Range, server: EmbeddedNats) -> None:
    """After ``ratchet creds``: the operator re-runs nats-config and reloads the server."""
    assert server.config_file is not None and server._proc is not None
    server.config_file.write_text(_nats_config(rng))
    os.kill(server._proc.pid, signal.SIGHUP)
    # Reloaded once the newest key connects (or, after a revoke, one still granted does).
    last = rng.keys["acme-producer"]
    async with asyncio.timeout(20):
        while not await rng.connects_with(last):  # noqa: ASYNC110 - another process reloads
            await asyncio.sleep(0.1)


def summary(per_config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tried = succeeded = ops = ok = 0
    names: list[str] = []
    failed: list[str] = []
    for config, results in per_config.items():
        for attack, outcome in results["attacks"].items():
            tried += 1
            if outcome is True:
                succeeded += 1
                names.append(f"{config}:{attack}")
        for op, outcome in results["legit"].items():
            ops += 1
            if outcome is True:
                ok += 1
            else:
                failed.append(f"{config}:{op}: {outcome}")
    return {"attacks_tried": tried, "attacks_succeeded": succeeded, "succeeded": names,
            "legit_ops": ops, "legit_ops_ok": ok, "legit_failed": failed}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default="default,tenants")
    args = parser.parse_args()
    configure_logging("error")
    started = time.monotonic()
    per_config: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ratchet-trust-") as tmp:
        for name in args.configs.split(","):
            per_config[name] = await configuration(name, Path(tmp))
    print(json.dumps({**summary(per_config), "seconds": round(time.monotonic() - started, 1),
                      "per_config": per_config}))


if __name__ == "__main__":
    asyncio.run(main())
