"""Supervision trees, the node, embedded NATS, intake, outbox relay, API, CLI.

Its names are imported at their first use (PEP 562): the CLI's commands other than
``serve`` do not load the node (docs/operations.md, "Restart (W4)")."""

from typing import TYPE_CHECKING

from ratchet.protocol.lazy_exports import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, {
    "ratchet.supervisors.node.node": ("Node", "NodeConfig"),
    "ratchet.supervisors.supervision.restart_policy": (
        "Restart", "Strategy", "backoff_delay", "intensity_exceeded"),
    "ratchet.supervisors.supervision.supervisor": ("ChildSpec", "Supervisor"),
}, globals(), __all__)
