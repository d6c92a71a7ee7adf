"""A node's eyes for operators: Prometheus metrics and health endpoints on one port
(``serve --metrics-port``; docs/operations.md, "Metrics", "Health", "Alerts")."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratchet.supervisors.observability.event_figures import EventFigures
    from ratchet.supervisors.observability.health import Readiness, readiness
    from ratchet.supervisors.observability.http import Observability

__all__ = ["EventFigures", "Observability", "Readiness", "readiness"]

# Names imported at their first use (PEP 562): ``serve`` reads readiness without loading
# the HTTP server (aiohttp) or the metrics (prometheus_client) unless a port asks for them.
_WHERE = {name: module for module, names in {
    "ratchet.supervisors.observability.event_figures": ("EventFigures",),
    "ratchet.supervisors.observability.health": ("Readiness", "readiness"),
    "ratchet.supervisors.observability.http": ("Observability",),
}.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
