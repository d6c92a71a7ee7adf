"""The web console's HTTP handlers against a real node (real NATS, real SQLite): login by a
keyring key's signature, tenant and role checks as the admin service makes them, decisions
through the admin service (audited), pages that show the graph, ledger and state diff."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import ratchet
from ratchet.persistence.admin_rows import AuditEntry
from ratchet.protocol.admin_verbs import VERB_ROLES
from ratchet.protocol.auth import Signer, new_seed
from ratchet.protocol.messages import AdminCommand
from ratchet.supervisors.console import Console, login_code
from ratchet.supervisors.console.pages import decision_box, diff_html
from ratchet.supervisors.console.svg import graph_svg
from ratchet.supervisors.services.admin import AdminActor
from tests import secret_apps
from tests.conftest import RATCHET_BIN, ROOT, NodeFactory, wait_terminal
from tests.console_helpers import challenge_of, csrf_of, logged_in, start_console
from tests.graph_apps import app as graph_app
from tests.keys import grant


async def waiting_for_approval(client: ratchet.Client, key: str) -> tuple[str, str]:
    """Submit an ``approve`` task; (task id, approval id) once it waits for a decision."""
    task_id = (await client.submit("approve", {"amount": 70}, key=key)).task_id
    async for event in client.watch(task_id):
        if event.type == "approval.requested":
            return task_id, event.payload["approval_id"]
    raise AssertionError("the task ended without asking for approval")


@pytest.fixture
async def console(start_node: NodeFactory) -> AsyncIterator[Console]:
    node = await start_node(graph_app)
    served = await start_console(node)
    served.node = node  # type: ignore[attr-defined]
    yield served
    await served.stop()


def node_of(console: Console) -> ratchet.Node:
    return console.node  # type: ignore[attr-defined,no-any-return]


async def status_of(console: Console, task_id: str) -> str:
    return (await console.store.load_task(task_id)).status


async def test_without_a_session_pages_send_to_the_login_and_actions_are_refused(
    console: Console
) -> None:
    async with aiohttp.ClientSession(base_url=console.url) as http:
        async with http.get("/tasks", allow_redirects=False) as page:
            assert page.status == 303 and page.headers["Location"] == "/login"
        async with http.post("/tasks/tsk_x/approve", data={"approval_id": "a"},
                             allow_redirects=False) as answer:
            assert answer.status == 401
        async with http.get("/nodes", allow_redirects=False,
                            cookies={"ratchet_console": "forged"}) as page:
            assert page.status == 303


async def test_a_login_needs_a_keyring_key_s_signature_over_a_fresh_challenge(
    console: Console
) -> None:
    stranger = Signer(new_seed())  # a well-formed key the keyring does not hold
    alice = await grant(node_of(console), "alice", "acme", ["viewer"])
    async with aiohttp.ClientSession(base_url=console.url,
                                     cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get("/login") as page:
            challenge = challenge_of(await page.text())
        code = login_code(stranger, challenge, console.node_id)
        async with http.post("/login", data={"challenge": challenge, "code": code}) as answer:
            assert answer.status == 401 and "unknown or revoked key" in await answer.text()
        # the challenge was used up by the refused attempt: alice's code for it fails too
        code = login_code(alice, challenge, console.node_id)
        async with http.post("/login", data={"challenge": challenge, "code": code}) as answer:
            assert answer.status == 401 and "challenge" in await answer.text()
        async with http.get("/login") as page:
            fresh = challenge_of(await page.text())
        other_node = login_code(alice, fresh, "another-node")  # signed for another console
        async with http.post("/login", data={"challenge": fresh, "code": other_node}) as answer:
            assert answer.status == 401
        assert not [c for c in http.cookie_jar if c.key == "ratchet_console"]


async def test_a_viewer_sees_the_pending_approval_but_cannot_approve_it(
    console: Console, client: ratchet.Client
) -> None:
    task_id, approval_id = await waiting_for_approval(client, "viewer-1")
    vic = await grant(node_of(console), "vic", "acme", ["viewer"])
    http = await logged_in(console, vic)
    async with http:
        async with http.get(f"/tasks/{task_id}") as page:
            html = await page.text()
        assert page.status == 200 and approval_id in html
        assert 'id="approve"' not in html and "needs the approver role" in html
        async with http.post(f"/tasks/{task_id}/approve", allow_redirects=False, data={
                "csrf": csrf_of(html), "approval_id": approval_id}) as answer:
            assert answer.status == 403
    assert await status_of(console, task_id) == "WAITING_APPROVAL"


async def test_another_tenant_s_task_is_not_found_for_reading_or_deciding(
    console: Console, client: ratchet.Client
) -> None:
    task_id, approval_id = await waiting_for_approval(client, "other-1")
    gus = await grant(node_of(console), "gus", "globex", ["approver"])
    http = await logged_in(console, gus)
    async with http:
        async with http.get("/tasks") as page:
            listing = await page.text()
            csrf = csrf_of(listing)
        assert task_id not in listing
        async with http.get(f"/tasks/{task_id}") as page:
            assert page.status == 404 and task_id not in await page.text()
        async with http.post(f"/tasks/{task_id}/approve", allow_redirects=False, data={
                "csrf": csrf, "approval_id": approval_id}) as answer:
            assert answer.status == 404
        async with http.get("/nodes") as page:
            assert page.status == 403  # the cluster is a _system viewer's
    assert await status_of(console, task_id) == "WAITING_APPROVAL"


async def test_an_approver_s_decision_goes_through_the_admin_service_and_is_audited(
    console: Console, client: ratchet.Client
) -> None:
    task_id, approval_id = await waiting_for_approval(client, "approve-1")
    ann = await grant(node_of(console), "ann", "acme", ["approver"])
    http = await logged_in(console, ann)
    async with http:
        async with http.get(f"/tasks/{task_id}") as page:
            html = await page.text()
        assert 'id="approve"' in html and 'class="node current"' in html
        async with http.post(f"/tasks/{task_id}/approve", allow_redirects=False,
                             data={"approval_id": approval_id}) as answer:
            assert answer.status == 403  # no CSRF token: not done
        async with http.post(f"/tasks/{task_id}/approve", data={
                "csrf": csrf_of(html), "approval_id": approval_id, "reason": "ok"}) as answer:
            assert answer.status == 200 and "approve: done" in await answer.text()
        assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
        async with http.get(f"/tasks/{task_id}?from=1&to=2") as page:
            html = await page.text()
        assert "SUCCEEDED" in html and "State diff #1" in html and "Ledger actions" in html
    history = await client.request_admin("history", {"command_id": "h1", "task_id": task_id})
    decided = [e for e in history["events"] if e["type"] == "approval.decided"]
    assert decided and decided[0]["payload"]["decided_by"] == "ann"


async def test_the_task_list_filters_by_status_workflow_age_and_tenant(
    console: Console, client: ratchet.Client
) -> None:
    waiting, _ = await waiting_for_approval(client, "list-1")
    done = (await client.submit("choice", {"amount": 5}, key="list-2")).task_id
    await wait_terminal(client, done)
    sam = await grant(node_of(console), "sam", "_system", ["viewer"])
    http = await logged_in(console, sam)

    async def listed(query: str) -> str:
        async with http.get("/tasks" + query) as page:
            assert page.status == 200
            return await page.text()

    async with http:
        every = await listed("")
        assert waiting in every and done in every and 'value="acme"' in every
        by_status = await listed("?status=WAITING_APPROVAL")
        assert waiting in by_status and done not in by_status
        by_workflow = await listed("?workflow=choice")
        assert done in by_workflow and waiting not in by_workflow
        assert waiting in await listed("?age=lt1h")
        old = await listed("?age=gt1h")
        assert waiting not in old and "no task matches" in old
        assert "no task matches" in await listed("?tenant=globex")


async def test_a_revoked_key_s_session_ends_at_its_next_request(
    console: Console, client: ratchet.Client
) -> None:
    node = node_of(console)
    sam = await grant(node, "sam", "_system", ["viewer"])
    http = await logged_in(console, sam)
    async with http:
        async with http.get("/nodes") as page:
            html = await page.text()
        assert page.status == 200 and console.node_id in html and "Partition leases" in html
        assert node.store is not None
        now = node.clock.now()
        await node.store.revoke_principal("_system", "sam", now, AuditEntry(
            "_system", now, "test", "revoke", "cmd-revoke-sam", None, "ok", {"name": "sam"}))
        async with http.get("/nodes", allow_redirects=False) as page:
            assert page.status == 303 and page.headers["Location"] == "/login"


def test_the_graph_highlights_the_current_node_and_escapes_names() -> None:
    svg = graph_svg("a", {"a": "step", "b<x>": "approval"},
                    [("a", "step", "next", "b<x>"), ("b<x>", "approval", "approve", "END"),
                     ("b<x>", "approval", "reject", "a")], current="b<x>", visits={"a": 1})
    assert 'class="node current" data-node="b&lt;x&gt;"' in svg
    assert 'class="node visited" data-node="a"' in svg and "<x>" not in svg


def test_the_state_diff_shows_added_removed_and_changed_keys_escaped() -> None:
    html = diff_html(1, 2, {"gone": 1, "same": 2, "moved": "<b>"}, {"same": 2, "moved": 3,
                                                                    "new": [1]})
    assert '<tr class="add"><td>new' in html and '<tr class="del"><td>gone' in html
    assert '<tr class="chg"><td>moved' in html and "&lt;b&gt;" in html and "same" not in html


def test_the_resolve_form_is_shown_only_when_the_node_serves_the_resolve_verb() -> None:
    pending = [{"approval_id": "apr_1", "node": "@handoff", "request": {"why": "x"},
                "request_hash": "sha256:1", "expires_at": None, "at": 1.0, "kind": "handoff"}]
    served = decision_box("tsk_1", pending, True, True, [("pay-1", "sha256:9")], "tok")
    assert 'action="/tasks/tsk_1/resolve"' in served and 'value="pay-1"' in served
    assert 'name="request_hash" value="sha256:9"' in served
    assert 'action="/tasks/tsk_1/retry-action"' in served
    assert 'id="approve"' in served and 'name="csrf" value="tok"' in served
    assert "/resolve" not in decision_box("tsk_1", pending, True, None, [("pay-1", "h")], "tok")
    viewer = decision_box("tsk_1", pending, False, False, [("pay-1", "h")], "tok")
    assert "/resolve" not in viewer and 'id="approve"' not in viewer


async def test_an_action_the_node_does_not_serve_is_refused(
    console: Console, client: ratchet.Client
) -> None:
    task_id, _ = await waiting_for_approval(client, "unserved-1")
    ann = await grant(node_of(console), "ann", "acme", ["approver", "operator"])
    http = await logged_in(console, ann)
    async with http:
        async with http.get(f"/tasks/{task_id}") as page:
            csrf = csrf_of(await page.text())
        verbs = ["purge"] + ([] if "resolve" in VERB_ROLES else ["resolve"])
        for verb in verbs:  # purge is an admin verb, not a console button
            async with http.post(f"/tasks/{task_id}/{verb}", data={"csrf": csrf}) as answer:
                assert answer.status == 200 and "has no action" in await answer.text()
    assert await status_of(console, task_id) == "WAITING_APPROVAL"


async def test_serve_with_a_console_port_serves_it_and_the_cli_signs_its_login(
    nats_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "served"
    proc = await asyncio.create_subprocess_exec(
        str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", "serve",
        "--app", "tests.graph_apps:app", "--nats-url", nats_url, "--node-id", "web-1",
        "--console-port", "0", cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b'"serving"' in line, line
        serving = json.loads(line)
        assert serving["console"].startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession(base_url=serving["console"],
                                         cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get("/login") as page:
                challenge = challenge_of(await page.text())
            signer = await asyncio.create_subprocess_exec(  # with the local admin key
                str(RATCHET_BIN), "--state-dir", str(state), "console-login", challenge,
                "--node", "web-1", stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(signer.communicate(), 30)
            assert signer.returncode == 0, err
            async with http.post("/login", data={"challenge": challenge,
                                                 "code": out.decode().strip()}) as page:
                html = await page.text()
            assert page.status == 200 and "local-admin @ _system" in html, html[-2000:]
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 30)


async def test_the_task_list_pages_on_within_a_tenant_and_refuses_a_forged_cursor(
    console: Console, client: ratchet.Client
) -> None:
    for i in range(3):
        await wait_terminal(client, (await client.submit("choice", {"amount": i},
                                                          key=f"page-{i}")).task_id)
    sam = await grant(node_of(console), "sam", "_system", ["viewer"])
    http = await logged_in(console, sam)
    async with http:
        rows, more = await console.reader.task_list(
            await console.sessions.principal(sam.public_key),
            {"tenant": "acme"}, limit=2)
        assert len(rows) == 2 and more is not None
        rest, last = await console.reader.task_list(
            await console.sessions.principal(sam.public_key),
            {"tenant": "acme", "cursor": more}, limit=2)
        assert len(rest) == 1 and last is None
        assert {r["task_id"] for r in rows}.isdisjoint(r["task_id"] for r in rest)
        async with http.get("/tasks?tenant=acme&cursor=nonsense") as page:
            assert page.status == 400


async def test_the_resolve_button_runs_the_admin_verb_by_name_once_the_node_serves_it(
    console: Console, client: ratchet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``resolve`` is another change's verb: here a stand-in for it is served, to pin what
    the console sends (the verb's name, its role check, the form's fields as ``args``)."""
    calls: list[tuple[str, Any]] = []

    async def resolve(self: AdminActor, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        calls.append((tenant, cmd))
        return {"task_id": cmd.task_id, "resolved": cmd.args["action"]}

    monkeypatch.setitem(VERB_ROLES, "resolve", "approver")
    monkeypatch.setattr(AdminActor, "_resolve", resolve, raising=False)
    task_id, _ = await waiting_for_approval(client, "resolve-1")
    node = node_of(console)
    vic, ann = (await grant(node, "vic", "acme", ["viewer"]),
                await grant(node, "ann", "acme", ["approver"]))
    form = {"action": "pay-1", "request_hash": "sha256:1", "outcome": "succeeded",
            "evidence": "bank statement 7"}
    for signer, expect in ((vic, 403), (ann, 200)):
        http = await logged_in(console, signer)
        async with http:
            async with http.get(f"/tasks/{task_id}") as page:
                csrf = csrf_of(await page.text())
            async with http.post(f"/tasks/{task_id}/resolve",
                                 data={"csrf": csrf, **form}) as answer:
                assert answer.status == expect
                if expect == 200:
                    assert "resolve: done" in await answer.text()
    assert len(calls) == 1
    tenant, cmd = calls[0]
    assert tenant == "acme" and cmd.task_id == task_id and cmd.args == form
    assert cmd.principal is not None and cmd.principal.name == "ann"


async def test_pages_show_secrets_redacted_and_unsettled_actions_for_resolving(
    start_node: NodeFactory, client: ratchet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(VERB_ROLES, "resolve", "approver")
    node = await start_node(secret_apps.app)
    console = await start_console(node)
    secret = f"sk-live-{secrets.token_hex(12)}"
    try:
        paid = (await client.submit("signup", {"customer": "c1", "api_key": secret},
                                    key="s-1")).task_id
        lost = (await client.submit("signup.lost", {"customer": "c2", "api_key": secret},
                                    key="s-2")).task_id
        await wait_terminal(client, paid)
        async for event in client.watch(lost):
            if event.type == "action.unknown":
                break
        ann = await grant(node, "ann", "acme", ["approver"])
        http = await logged_in(console, ann)
        async with http:
            pages = []
            for task_id, query in ((paid, "?from=1&to=3"), (lost, "")):
                async with http.get(f"/tasks/{task_id}{query}") as page:
                    assert page.status == 200
                    pages.append(await page.text())
        assert all(secret not in html and "**redacted**" in html for html in pages)
        assert "State diff #1" in pages[0] and "ch-c1" in pages[0]
        assert 'action="/tasks/' + lost + '/resolve"' in pages[1]
        assert 'value="lost:c2"' in pages[1] and "UNKNOWN" in pages[1]
    finally:
        await console.stop()


async def test_an_approver_settles_an_unknown_action_through_the_page_with_the_real_verb(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    """The resolve form carries the request hash the page showed; the admin service's
    ``resolve`` settles the action with the evidence, and the task goes on."""
    node = await start_node(secret_apps.app)
    console = await start_console(node)
    try:
        lost = (await client.submit("signup.lost", {"customer": "c3", "api_key": "sk-x"},
                                    key="s-3")).task_id
        async for event in client.watch(lost, idle_timeout=30):
            if event.type == "task.unknown":  # parked: the charge's outcome is lost
                break
        [action] = await node.store.task_actions(lost)  # type: ignore[union-attr]
        ann = await grant(node, "ann", "acme", ["approver"])
        http = await logged_in(console, ann)
        async with http:
            async with http.get(f"/tasks/{lost}") as page:
                html = await page.text()
            assert f'name="request_hash" value="{action.request_hash}"' in html
            form = {"csrf": csrf_of(html), "action": action.key,
                    "request_hash": action.request_hash, "outcome": "failed",
                    "evidence": "the provider has no such charge"}
            async with http.post(f"/tasks/{lost}/resolve", data=form) as answer:
                assert answer.status == 200 and "resolve: done" in await answer.text()
        events = await wait_terminal(client, lost)
        assert "action.human_resolved" in [e.type for e in events]
        [settled] = await node.store.task_actions(lost)  # type: ignore[union-attr]
        assert settled.status == "FAILED"
        assert await status_of(console, lost) != "UNKNOWN"
    finally:
        await console.stop()


async def test_an_operator_cancels_a_task_from_its_page_and_a_viewer_sees_no_button(
    console: Console, client: ratchet.Client
) -> None:
    task_id, _ = await waiting_for_approval(client, "control-1")
    node = node_of(console)
    vic, olga = (await grant(node, "vic", "acme", ["viewer"]),
                 await grant(node, "olga", "acme", ["operator"]))
    http = await logged_in(console, vic)
    async with http:
        async with http.get(f"/tasks/{task_id}") as page:
            html = await page.text()
        assert 'id="control"' not in html and 'action="/tasks/' + task_id + '/cancel"' not in html
        async with http.post(f"/tasks/{task_id}/cancel", data={"csrf": csrf_of(html)}) as answer:
            assert answer.status == 403
    http = await logged_in(console, olga)
    async with http:
        async with http.get(f"/tasks/{task_id}") as page:
            html = await page.text()
        assert 'action="/tasks/' + task_id + '/cancel"' in html and 'id="pause"' not in html
        async with http.post(f"/tasks/{task_id}/cancel",
                             data={"csrf": csrf_of(html), "reason": "by hand"}) as answer:
            assert answer.status == 200 and "cancel: done" in await answer.text()
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.cancelled" and events[-1].payload["by"] == "olga"
