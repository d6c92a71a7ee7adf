"""Is the node ready? The checks behind ``/readyz`` and ``serve``'s bounded wait to be ready
(docs/operations.md, "Health").

Ready means all of:

- ``store``: the store takes writes — the lease manager's last heartbeat (a write, made
  every ``--lease-interval``) was recorded within three intervals (or the lease TTL, if
  longer), and the database file is still the node's (``file_lost``). No extra write per probe: a probe every second
  from several watchers must not cost the store anything.
- ``nats``: the node's NATS connection is up (not closed, not reconnecting).
- ``leases``: the node holds at least one partition lease, or holds none on purpose —
  it is draining (``admin drain``) or stopping. An active node that holds none is still
  waiting for a share (another node has not handed its surplus over yet).
- ``node``: it has started and has not failed (root supervisor gave up, file lost).

Pure reads of the node's state, no I/O: cheap enough for any probe rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ratchet.supervisors.node.node import Node

__all__ = ["Readiness", "readiness"]

#: A heartbeat older than this many lease intervals means the store is not taking writes.
_STALE_INTERVALS = 3.0


@dataclass
class Readiness:
    """Each check's verdict: name → (ok, why)."""

    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return bool(self.checks) and all(ok for ok, _ in self.checks.values())

    def failing(self) -> str:
        """The failing checks in one line, for people (``serve``'s refusal message)."""
        return "; ".join(f"{name}: {why}" for name, (ok, why) in self.checks.items() if not ok)

    def to_json(self) -> dict[str, object]:
        return {"ready": self.ready,
                "checks": {n: {"ok": ok, "detail": why} for n, (ok, why) in self.checks.items()}}


def readiness(node: Node) -> Readiness:
    """The node's readiness now (see the module's doc for what each check means)."""
    out = Readiness()
    leases = node.leases
    if node.failed.is_set():
        out.checks["node"] = (False, "failed: " + (node.store_lost or "its supervisor gave up"))
    elif leases is None or leases.last_heartbeat is None:
        out.checks["node"] = (False, "starting")
    else:
        out.checks["node"] = (True, "serving")
    out.checks["store"] = _store(node)
    bus = node.bus
    if bus is None:
        out.checks["nats"] = (False, "not connected yet")
    elif bus.nc.is_connected:
        out.checks["nats"] = (True, "connected")
    else:
        out.checks["nats"] = (False, "reconnecting" if bus.nc.is_reconnecting
                              else "disconnected")
    if leases is None:
        out.checks["leases"] = (False, "no lease manager yet")
    elif leases.held:
        out.checks["leases"] = (True, f"{len(leases.held)} partitions held")
    elif leases.stopping or leases.status != "active":
        why = "stopping" if leases.stopping else leases.status
        out.checks["leases"] = (True, f"none held on purpose ({why})")
    else:
        out.checks["leases"] = (False, "none held yet (waiting for a share)")
    return out


def _store(node: Node) -> tuple[bool, str]:
    if node.store is None:
        return False, "not open yet"
    if node.store_lost is not None:
        return False, f"database file lost: {node.store_lost}"
    leases = node.leases
    if leases is None or leases.last_heartbeat is None:
        return False, "no heartbeat written yet"
    age = leases.clock.monotonic() - leases.last_heartbeat
    # Never tighter than the lease TTL: a heartbeat that late has let the leases lapse anyway.
    bound = max(_STALE_INTERVALS * leases.settings.interval, leases.settings.ttl)
    if age > bound:
        return False, f"last heartbeat written {age:.1f} s ago (more than {bound:.1f} s)"
    return True, f"heartbeat written {age:.1f} s ago"
