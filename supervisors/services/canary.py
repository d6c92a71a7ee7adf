"""Canary routing of new tasks between versions of a workflow (``ratchet serve
--route-new-tasks WORKFLOW=VERSION:PERCENT``, docs/operations.md, "Canary versions").

A submission that names no version goes to the route's version with that probability and
otherwise to the default (the latest registered version). The draw is not random: it is a
hash of the workflow and the idempotency key, so a retried submission lands on the version
its first attempt did (its request then matches, and no CONFLICT follows), and 0 and 100
mean none and all. A submission that names a version is never rerouted. The version chosen
is the task's (``tasks.workflow_version``, ``task.queued``'s ``workflow_version``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from ratchet.protocol.errors import UsageError

__all__ = ["Routes", "check_routes", "parse_routes", "routed_version"]

#: workflow → (version, percent of new tasks it gets)
Routes = Mapping[str, tuple[int, float]]


def parse_routes(items: Iterable[str]) -> dict[str, tuple[int, float]]:
    """``WORKFLOW=VERSION:PERCENT`` items (the flag's), one per workflow.

    Raises:
        UsageError: a malformed item, a version < 1, a percent outside 0..100, or one
            workflow routed twice.
    """
    routes: dict[str, tuple[int, float]] = {}
    for item in items:
        workflow, _, target = item.partition("=")
        version, _, percent = target.partition(":")
        try:
            route = (int(version), float(percent))
        except ValueError:
            route = (0, -1.0)
        if not workflow or not 1 <= route[0] or not 0.0 <= route[1] <= 100.0:
            raise UsageError(f"--route-new-tasks {item!r}: use WORKFLOW=VERSION:PERCENT,"
                             " e.g. expense=2:10 (a version >= 1, a percent 0..100)")
        if workflow in routes:
            raise UsageError(f"--route-new-tasks: workflow {workflow!r} is routed twice")
        routes[workflow] = route
    return routes


def check_routes(routes: Routes, registry: Any) -> None:
    """Each route names a registered version (UsageError otherwise: a typo must not send
    new tasks nowhere)."""
    for workflow, (version, _) in routes.items():
        if version not in registry.versions(workflow):
            raise UsageError(f"--route-new-tasks {workflow}={version}: workflow {workflow!r}"
                             f" has no version {version} in this app (registered:"
                             f" {registry.versions(workflow) or 'none'})")


def routed_version(routes: Routes, workflow: str, idempotency_key: str) -> int | None:
    """The version a new task of ``workflow`` without one goes to; None: the default."""
    route = routes.get(workflow)
    if route is None:
        return None
    version, percent = route
    digest = hashlib.sha256(f"{workflow}\0{idempotency_key}".encode()).digest()
    draw = int.from_bytes(digest[:8], "big") / 2**64 * 100.0  # in [0, 100)
    return version if draw < percent else None
