"""The store ports (persistence/ports.py): the SQLite Store implements each of them with
the same signatures, and the upper layers depend on the ports, not on the SQLite module.

mypy checks the conformance statically where the node assigns ``Store.open(...)`` to its
``StorePort`` attribute (and in the typed assignments below); these tests check it at
runtime, parameter for parameter, so that a port and the implementation cannot drift."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest

from ratchet.persistence.ports import (
    AdminStore,
    DeadLetterStore,
    DiagnoseStore,
    DriftStore,
    Fence,
    KeyringStore,
    LeaseStore,
    MetricStore,
    OutboxStore,
    ScheduleStore,
    SettleStore,
    StorePort,
    SweepStore,
    TaskStore,
    VersionStore,
)
from ratchet.persistence.store import Store
from tests.conftest import ROOT

CONCERNS: list[type[Any]] = [TaskStore, OutboxStore, AdminStore, LeaseStore, KeyringStore,
                             ScheduleStore, DriftStore, SweepStore, SettleStore,
                             MetricStore, DiagnoseStore, DeadLetterStore, VersionStore]
PORTS: list[type[Any]] = [*CONCERNS, StorePort]
#: Where a store is opened: the only modules of the upper layers that name the SQLite class
#: (the node; and ``ratchet nats-config``, which reads the keyring with no node running).
COMPOSITION_ROOTS = {"supervisors/node/node_trust.py", "supervisors/node/nats_auth.py"}
UPPER_LAYERS = ("actors", "supervisors")


def _declared(port: type[Any]) -> dict[str, str]:
    """Every member ``port`` declares (its own and its protocol bases'): name → kind."""
    members: dict[str, str] = {}
    for cls in reversed(port.__mro__):
        if not getattr(cls, "_is_protocol", False) or cls is typing.Protocol:
            continue
        for name in inspect.get_annotations(cls):
            members[name] = "attribute"
        for name, value in vars(cls).items():
            if name.startswith("_"):
                continue
            members[name] = "property" if isinstance(value, property) else "method"
    return members


def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(fn, eval_str=True)


@pytest.mark.parametrize("port", PORTS, ids=lambda p: p.__name__)
def test_the_sqlite_store_implements_each_port_with_the_same_signatures(port: type[Any]) -> None:
    members = _declared(port)
    assert members, port
    for name, kind in members.items():
        if kind == "attribute":
            continue  # instance attributes: see the test on an opened store
        assert hasattr(Store, name), f"Store lacks {port.__name__}.{name}"
        declared, implemented = inspect.getattr_static(port, name), \
            inspect.getattr_static(Store, name)
        if kind == "property":
            assert isinstance(implemented, property), f"Store.{name} is not a property"
            declared, implemented = declared.fget, implemented.fget
        want, got = _signature(declared), _signature(implemented)
        assert list(got.parameters.values()) == list(want.parameters.values()), \
            f"{port.__name__}.{name}{want} != Store.{name}{got}"
        assert got.return_annotation == want.return_annotation, f"{name} returns"
        assert inspect.iscoroutinefunction(implemented) == \
            inspect.iscoroutinefunction(declared), f"{name}: async in one, not the other"


def test_the_ports_declare_the_fence_the_node_sets() -> None:
    assert _declared(TaskStore)["fence"] == "attribute"
    hints = typing.get_type_hints(TaskStore)
    assert hints["fence"] == Fence | None


def test_each_member_belongs_to_one_concern_and_the_whole_store_has_them_all() -> None:
    seen: dict[str, str] = {}
    for port in CONCERNS:
        for name in _declared(port):
            assert name not in seen, f"{name} in both {seen.get(name)} and {port.__name__}"
            seen[name] = port.__name__
    whole = _declared(StorePort)
    assert set(seen) <= set(whole)
    assert set(whole) - set(seen) == {"close", "writer_stats", "wal_stats",  # lifecycle
                                      "file_lost", "rescued_to", "on_file_lost",
                                      "use_secrets", "secret_key_ids"}


async def test_an_opened_sqlite_store_is_each_port(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    try:
        # The annotations are the point: mypy checks these assignments.
        tasks: TaskStore = store
        outbox: OutboxStore = store
        admin: AdminStore = store
        leases: LeaseStore = store
        whole: StorePort = store
        for port in PORTS:
            assert isinstance(store, port), port.__name__
        assert tasks.fence is None  # no node: writes are not fenced
        assert await tasks.active_tasks() == []
        assert await outbox.pending_outbox() == []
        assert await admin.switches() == []
        assert await leases.leases() == []
        assert whole.writer_stats is not None and whole.wal_stats is not None
    finally:
        await store.close()


def _store_imports(path: Path) -> list[str]:
    """The imports of ``path`` that reach the SQLite store module or its class."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name == "ratchet.persistence.store"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {a.name for a in node.names}
            if node.module == "ratchet.persistence.store" or (
                    node.module == "ratchet.persistence" and names & {"Store", "store"}):
                found.append(f"{node.lineno}: from {node.module} import {', '.join(names)}")
    return found


def test_the_upper_layers_import_the_ports_and_only_the_composition_root_the_store() -> None:
    offenders = []
    for layer in UPPER_LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in COMPOSITION_ROOTS:
                continue
            offenders += [f"{rel}:{line}" for line in _store_imports(path)]
    assert offenders == []


def test_the_composition_root_uses_the_sqlite_class_only_to_open_the_store() -> None:
    for rel in COMPOSITION_ROOTS:
        tree = ast.parse((ROOT / rel).read_text(), rel)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        uses = [node for node in ast.walk(tree)
                if isinstance(node, ast.Name) and node.id == "Store"]
        assert uses, rel
        for use in uses:
            parent = parents[use]
            assert isinstance(parent, ast.Attribute) and parent.attr == "open", \
                f"{rel}:{use.lineno} uses Store other than Store.open"
