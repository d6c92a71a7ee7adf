"""A node's eyes for operators: Prometheus metrics and health endpoints on one port
(``serve --metrics-port``; docs/operations.md, "Metrics", "Health", "Alerts")."""

from ratchet.supervisors.observability.event_figures import EventFigures
from ratchet.supervisors.observability.health import Readiness, readiness
from ratchet.supervisors.observability.http import Observability

__all__ = ["EventFigures", "Observability", "Readiness", "readiness"]
