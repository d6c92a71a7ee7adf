"""Supervision trees, the node, embedded NATS, intake, outbox relay, API, CLI."""

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
