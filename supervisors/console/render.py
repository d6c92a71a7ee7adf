"""The console's HTML building blocks: the page layout, escaping, times, tables, values.

Everything shown is escaped here (``esc``): task inputs, event payloads and error messages
come from users and models, and must never become markup in an operator's browser.
Secrets are already ``**redacted**`` by the store's reads and ``redact`` (docs/security-secrets.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from ratchet.protocol.admin_verbs import SYSTEM_TENANT
from ratchet.protocol.auth import Principal
from ratchet.protocol.redaction import redact

__all__ = ["SCRIPT", "age", "esc", "layout", "login_page", "message_page", "pretty", "q", "table", "ts",
           "url"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#cfe0ff;text-decoration:none}header .who{margin-left:auto;font-size:12px}
main{padding:12px 16px}h1{font-size:20px;margin:8px 0}h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border:1px solid #dde1e8;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eef1f5}pre{margin:0;white-space:pre-wrap;word-break:break-all;font-size:12px}
.status{font-weight:600;padding:1px 6px;border-radius:3px;background:#e4e7ec}
.s-SUCCEEDED{background:#cdebd3}.s-FAILED,.s-CANCELLED{background:#f6d0d0}
.s-WAITING_APPROVAL,.s-UNKNOWN{background:#fde7b0}.s-RUNNING{background:#cfe0ff}
.box{background:#fff;border:1px solid #dde1e8;padding:8px 12px;margin:8px 0}
.pending{border-color:#e0a800;background:#fffaf0}.flash{background:#e9f6ec;padding:6px 10px}
.error{background:#fbe3e3;padding:6px 10px}form.inline{display:inline}
button{padding:4px 12px;margin-right:6px}.ro{color:#666;font-style:italic}
svg.graph .node rect{fill:#fff;stroke:#8a94a6}svg.graph .visited rect{fill:#eef4ff}
svg.graph .current rect{fill:#ffd54a;stroke:#b07d00;stroke-width:3}
svg.graph text{font-size:12px}svg.graph .kind{fill:#666;font-size:10px}
svg.graph .edge{fill:none;stroke:#8a94a6}svg.graph .cond{font-size:10px;fill:#555}
.add{background:#e6ffec}.del{background:#ffebe9}.chg{background:#fff8c5}
"""

#: Refreshes a page that shows live state (``data-refresh`` seconds on <body>) unless the
#: user is typing in a form; and asks before a rejection. The only script of the console.
SCRIPT = """
(function(){var s=parseInt(document.body.dataset.refresh||"0",10);
if(s>0){setInterval(function(){var a=document.activeElement;
if(!a||!/INPUT|TEXTAREA|SELECT/.test(a.tagName)){location.reload();}},s*1000);}
document.querySelectorAll("form[data-confirm]").forEach(function(f){
f.addEventListener("submit",function(e){if(!confirm(f.dataset.confirm)){e.preventDefault();}});});
})();
"""


def esc(value: Any) -> str:
    return escape(str(value), quote=True)


def q(value: Any) -> str:
    """``value`` for a URL path segment."""
    return quote(str(value), safe="")


def url(path: str, **params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return esc(path + ("?" + urlencode(kept) if kept else ""))


def ts(at: float | None) -> str:
    if at is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"


def age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def pretty(value: Any, limit: int = 20_000) -> str:
    """A value as indented JSON in a <pre>, redacted and escaped, cut at ``limit``."""
    text = json.dumps(redact(value), indent=2, sort_keys=True, default=str)
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(text) - limit} more characters)"
    return f"<pre>{esc(text)}</pre>"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str = "none") -> str:
    """A table of cells already rendered (escape what is not markup)."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="ro">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def status(value: str) -> str:
    return f'<span class="status s-{esc(value)}">{esc(value)}</span>'


def layout(title: str, body: str, who: Principal | None = None, csrf: str = "",
           refresh: int = 0) -> str:
    nav = ""
    if who is not None:
        roles = ", ".join(sorted(who.granted))
        nodes = '<a href="/nodes">Nodes</a>' if who.tenant == SYSTEM_TENANT else ""
        nav = ('<a href="/tasks">Tasks</a>' + nodes +
               f'<span class="who">{esc(who.name)} @ {esc(who.tenant)} ({esc(roles)})'
               f' <form class="inline" method="post" action="/logout">'
               f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
               '<button id="logout">log out</button></form></span>')
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{esc(title)} · Ratchet</title><style>{_CSS}</style></head>"
            f'<body data-refresh="{refresh}"><header><b>Ratchet</b>{nav}</header>'
            f"<main>{body}</main><script>{SCRIPT}</script></body></html>")


def message_page(title: str, text: str, who: Principal | None = None, csrf: str = "") -> str:
    return layout(title, f'<h1>{esc(title)}</h1><p class="error">{esc(text)}</p>'
                  '<p><a href="/tasks">Back to the tasks</a></p>', who, csrf)


def login_page(challenge: str, node_id: str, error: str | None = None) -> str:
    shown = f'<p class="error" id="login-error">{esc(error)}</p>' if error else ""
    body = f"""<h1>Log in to the console of {esc(node_id)}</h1>{shown}
<div class="box"><p>Sign this challenge with your Ratchet key, on the machine where the key
is (the seed never leaves it), and paste the code it prints:</p>
<pre id="command">ratchet console-login {esc(challenge)} --node {esc(node_id)} --creds YOUR-KEY.nk</pre>
<p>The challenge works once, for five minutes. Your key's roles in the keyring decide what
you may see and do; viewers only read.</p>
<form method="post" action="/login"><input type="hidden" name="challenge" id="challenge"
 value="{esc(challenge)}"><label>Login code <input name="code" id="code" size="80"
 autocomplete="off"></label> <button id="login">Log in</button></form></div>"""
    return layout("Log in", body)
