"""A node's eyes for operators: Prometheus metrics and health endpoints on one port
(``serve --metrics-port``; docs/operations.md, "Metrics", "Health", "Alerts")."""

from typing import TYPE_CHECKING

from ratchet.protocol.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from ratchet.supervisors.observability.event_figures import EventFigures
    from ratchet.supervisors.observability.health import Readiness, readiness
    from ratchet.supervisors.observability.http import Observability

__all__ = ["EventFigures", "Observability", "Readiness", "readiness"]

# Names imported at their first use (PEP 562): ``serve`` reads readiness without loading
# the HTTP server (aiohttp) or the metrics (prometheus_client) unless a port asks for them.
__getattr__, __dir__ = lazy_exports(__name__, {
    "ratchet.supervisors.observability.event_figures": ("EventFigures",),
    "ratchet.supervisors.observability.health": ("Readiness", "readiness"),
    "ratchet.supervisors.observability.http": ("Observability",),
}, globals(), __all__)
