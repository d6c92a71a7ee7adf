"""Supervision trees, the node, embedded NATS, intake, outbox relay, API, CLI.

Its names are imported at their first use (PEP 562): the CLI's commands other than
``serve`` do not load the node (docs/operations.md, "Restart (W4)")."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratchet.supervisors.node.node import Node, NodeConfig
    from ratchet.supervisors.supervision.restart_policy import (
        Restart,
        Strategy,
        backoff_delay,
        intensity_exceeded,
    )
    from ratchet.supervisors.supervision.supervisor import ChildSpec, Supervisor

__all__ = [
    "Node",
    "NodeConfig",
    "Restart",
    "Strategy",
    "backoff_delay",
    "intensity_exceeded",
    "ChildSpec",
    "Supervisor",
]

_WHERE = {name: module for module, names in {
    "ratchet.supervisors.node.node": ("Node", "NodeConfig"),
    "ratchet.supervisors.supervision.restart_policy": (
        "Restart", "Strategy", "backoff_delay", "intensity_exceeded"),
    "ratchet.supervisors.supervision.supervisor": ("ChildSpec", "Supervisor"),
}.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ratchet.supervisors' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
