"""Whether a process traces (``serve --otel`` or the standard ``OTEL_*`` variables):
read without importing the OpenTelemetry SDK, which ``supervisors/node/otel.py`` loads
only when traces are on (docs/operations.md, "Traces" and "Restart (W4)")."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["wanted"]


def wanted(flag: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process traces: ``--otel``, or the standard variables (otel.py's doc)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return flag or bool(exporter) or bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")) \
        or bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
