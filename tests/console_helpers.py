"""Helpers for the web console's tests and bench: a console over a started node, and a
login as a key holder does it (the challenge from the page, the code signed with the key)."""

from __future__ import annotations

import re

import aiohttp

import ratchet
from ratchet.protocol.auth import Signer
from ratchet.supervisors.console import Console, login_code

CHALLENGE = re.compile(r'id="challenge"\s+value="([^"]+)"')
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def challenge_of(html: str) -> str:
    found = CHALLENGE.search(html)
    assert found, "the login page shows no challenge"
    return found.group(1)


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "the page carries no CSRF token"
    return found.group(1)


async def start_console(node: ratchet.Node) -> Console:
    console = Console.for_node(node, "127.0.0.1", 0)
    await console.start()
    return console


async def logged_in(console: Console, signer: Signer) -> aiohttp.ClientSession:
    """An HTTP session of the console, logged in with ``signer``'s key."""
    http = aiohttp.ClientSession(base_url=console.url,
                                 cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with http.get("/login") as page:
        challenge = challenge_of(await page.text())
    code = login_code(signer, challenge, console.node_id)
    async with http.post("/login", data={"challenge": challenge, "code": code},
                         allow_redirects=False) as answer:
        assert answer.status == 303, await answer.text()
    return http
