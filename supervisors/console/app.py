"""The web console: an aiohttp server a node runs beside its NATS services
(``ratchet serve --console-port N``; off by default; loopback unless ``--console-host``).

Routes: ``/login`` (GET: a challenge; POST: its signed code), ``/logout``, ``/tasks`` (the
list, filters ``tenant``, ``status``, ``workflow``, ``age``), ``/tasks/<id>`` (the task;
``?from=&to=`` adds a state diff between two checkpoints), ``POST /tasks/<id>/<verb>``
(approve, reject, resolve: actions.py), ``/nodes`` (nodes, partitions, leases, heartbeats).
Every route but the login's needs a session (auth.py); pages are server-rendered HTML
with one small inline script, allowed by its hash in the Content-Security-Policy.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from ratchet.persistence.admin_rows import AuditEntry
from ratchet.protocol.auth import Principal
from ratchet.protocol.errors import ErrorCode, RatchetError, Unauthenticated
from ratchet.protocol.ids import new_id
from ratchet.supervisors.console.actions import Actions
from ratchet.supervisors.console.auth import COOKIE, SESSION_MAX_S, Session, Sessions
from ratchet.supervisors.console.pages import nodes_body, task_body, tasks_body
from ratchet.supervisors.console.render import SCRIPT, layout, login_page, message_page, q
from ratchet.supervisors.console.views import Reader
from ratchet.supervisors.services.admin import AdminActor

__all__ = ["Console"]

log = structlog.get_logger("ratchet.console")

WHO = web.RequestKey("who", Principal)
SESSION = web.RequestKey("session", Session)
FORM = web.RequestKey("form", dict[str, str])
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_STATUS = {ErrorCode.UNAUTHENTICATED: 401, ErrorCode.PERMISSION_DENIED: 403,
           ErrorCode.NOT_FOUND: 404, ErrorCode.INVALID_ARGUMENT: 400,
           ErrorCode.UNAVAILABLE: 503}
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline';"
                               f" script-src 'sha256-{_SCRIPT_HASH}'; form-action 'self';"
                               " frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store", "X-Frame-Options": "DENY"}


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers=_HEADERS)


class Console:
    """Args:
        admin: an AdminActor over the node's parts; the console calls its ``answer``.
        port: 0 for a free one (then :attr:`port` is the one bound after :meth:`start`).
    """

    def __init__(self, admin: AdminActor, registry: Any, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.admin = admin
        self.node_id = admin.node_id
        self.clock = admin.clock
        self.store = admin.store
        self.host, self.port = host, port
        self.sessions = Sessions(self.store, self.clock, self.node_id)
        self.reader = Reader(self.store, registry, self.clock, admin.leases)
        self.actions = Actions(admin, self.reader)
        self._runner: web.AppRunner | None = None

    @classmethod
    def for_node(cls, node: Any, host: str = "127.0.0.1", port: int = 0) -> Console:
        """The console of a started ``Node``."""
        admin = AdminActor(node.bus, node.authn, node.store, node.system, node.clock,
                           node.config.node_id, node.tasks, node.switches, node.leases)
        return cls(admin, node.registry, host, port)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=64 * 1024)
        app.add_routes([
            web.get("/login", self._login_page), web.post("/login", self._login),
            web.post("/logout", self._logout), web.get("/", self._root),
            web.get("/tasks", self._tasks), web.get("/tasks/{task_id}", self._task),
            web.post("/tasks/{task_id}/{verb}", self._act), web.get("/nodes", self._nodes)])
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("console serving", url=self.url, node=self.node_id)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- the guard: a session on every route but the login's; errors as pages ----------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path != "/login":
                session, who = await self.sessions.resolve(request.cookies.get(COOKIE))
                request[SESSION], request[WHO] = session, who
                if request.method == "POST":
                    form = await request.post()
                    request[FORM] = {k: str(v) for k, v in form.items()}
                    self.sessions.check_csrf(session, request[FORM].get("csrf"))
            return await handler(request)
        except Unauthenticated as exc:
            if request.method == "GET":
                raise web.HTTPSeeOther("/login") from None
            return _html(message_page("Not logged in", exc.message), 401)
        except RatchetError as exc:
            known, current = request.get(WHO), request.get(SESSION)
            return _html(message_page(exc.code.value.replace("_", " ").capitalize(),
                                             exc.message, known,
                                             current.csrf if current else ""),
                         _STATUS.get(exc.code, 409))

    def _page(self, request: web.Request, title: str, body: str, refresh: int = 0) -> web.Response:
        return _html(layout(title, body, request[WHO], request[SESSION].csrf,
                                   refresh))

    # -- login -------------------------------------------------------------------------

    async def _login_page(self, request: web.Request) -> web.Response:
        return _html(login_page(self.sessions.challenges.new(), self.node_id))

    async def _login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        challenge, code = str(form.get("challenge", ""))[:200], str(form.get("code", ""))[:400]
        try:
            token, who = await self.sessions.login(challenge, code)
        except Unauthenticated as exc:
            log.warning("console login refused", reason=exc.message, remote=request.remote)
            return _html(login_page(self.sessions.challenges.new(), self.node_id,
                                           exc.message), 401)
        await self.store.audit(AuditEntry(
            who.tenant, self.clock.now(), who.name, "console-login", new_id("cmd"), None, "ok",
            {"node": self.node_id, "key": who.public_key, "remote": request.remote}))
        log.info("console login", principal=who.name, tenant=who.tenant)
        response = web.HTTPSeeOther("/tasks")
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/",
                            max_age=int(SESSION_MAX_S), secure=request.secure)
        raise response

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.logout(request.cookies.get(COOKIE))
        response = web.HTTPSeeOther("/login")
        response.del_cookie(COOKIE, path="/")
        raise response

    # -- pages -------------------------------------------------------------------------

    async def _root(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther("/tasks")

    async def _tasks(self, request: web.Request) -> web.Response:
        who = request[WHO]
        filters = {k: (request.query.get(k) or None)
                   for k in ("tenant", "status", "workflow", "age", "cursor")}
        rows, more = await self.reader.task_list(who, filters)
        tenants = await self.reader.tenants_of(who)
        workflows = self.reader.registry.names()
        shown = {k: v for k, v in filters.items() if k != "cursor"}
        return self._page(request, "Tasks", tasks_body(rows, shown, tenants, workflows,
                                                       self.clock.now(), more))

    async def _task(self, request: web.Request) -> web.Response:
        chosen = None
        if request.query.get("from") and request.query.get("to"):
            try:
                chosen = (int(request.query["from"]), int(request.query["to"]))
            except ValueError:
                chosen = None
        view = await self.reader.task_page(request[WHO], request.match_info["task_id"],
                                           request[SESSION].csrf, chosen)
        kind, text = request[SESSION].flash or ("", "")
        request[SESSION].flash = None
        view.data["flash" if kind == "done" else "error"] = text or None
        live = view.rec.status not in ("SUCCEEDED", "FAILED", "CANCELLED")
        return self._page(request, f"Task {view.rec.task_id}",
                          task_body(view.rec, view.data, self.clock.now()),
                          refresh=5 if live and chosen is None else 0)

    async def _act(self, request: web.Request) -> web.StreamResponse:
        task_id, verb = request.match_info["task_id"], request.match_info["verb"]
        back = f"/tasks/{q(task_id)}"
        try:
            result = await self.actions.run(request[WHO], verb, task_id, request[FORM])
        except RatchetError as exc:
            if exc.code in (ErrorCode.NOT_FOUND, ErrorCode.PERMISSION_DENIED):
                raise  # a page of its own: the task is not shown to this user
            request[SESSION].flash = ("error", f"{verb}: {exc.message}")
            raise web.HTTPSeeOther(back) from None
        log.info("console action", verb=verb, task_id=task_id, principal=request[WHO].name)
        request[SESSION].flash = ("done", f"{verb}: done ({_brief(result)})")
        raise web.HTTPSeeOther(back)

    async def _nodes(self, request: web.Request) -> web.Response:
        nodes, leases = await self.reader.nodes(request[WHO])
        return self._page(request, "Nodes", nodes_body(nodes, leases, self.node_id), refresh=5)


def _brief(result: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in list(result.items())[:4])[:300]
