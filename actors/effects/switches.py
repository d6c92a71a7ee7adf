"""Kill switches for incidents, read on every call and every step (in memory, loaded from
the store at start and changed by the admin service, which persists them first).

Each switch has a scope: a tenant (set on ``ratchet.admin.<tenant>.…``: that tenant's
tasks only) or ``_system`` (set on ``ratchet.admin._system.…`` by the platform's
operators: every tenant's tasks).

- a disabled tool: no new call of it is made by the tasks in scope — the action fails
  with UNAVAILABLE ``tool disabled``; calls already in flight finish (or end UNKNOWN);
- frozen dispatch: no new step starts in scope — running steps finish at their safe
  point, tasks wait (QUEUED or between steps) until thawed.

The node's circuit breakers (actors/effects/breakers.py) ride along as ``breakers``: the
switches no operator has to throw, read on the same calls; and the tenants' risk policy
(``risk``: actors/effects/risk_policy.py), the tightening of tool tiers a node is given.
"""

from __future__ import annotations

import asyncio

from ratchet.actors.effects.breakers import CircuitBreakers
from ratchet.actors.effects.risk_policy import RiskPolicy
from ratchet.protocol.admin_verbs import SYSTEM_TENANT
from ratchet.protocol.errors import ActionFailed, ErrorCode

__all__ = ["Switches"]


class Switches:
    def __init__(self, risk: RiskPolicy | None = None) -> None:
        #: Disabled tool names by scope.
        self._tools: dict[str, set[str]] = {}
        #: The scopes whose dispatch is frozen.
        self._frozen: set[str] = set()
        #: The automatic switches: a provider's calls stop while it keeps failing.
        self.breakers = CircuitBreakers()
        #: Tenants' tightening of tool tiers (which calls wait for a human's approval).
        self.risk: RiskPolicy = risk or {}
        #: Set when the switches change (then replaced): what a frozen branch waits on.
        self._changed: asyncio.Event | None = None

    def _touch(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def load(self, rows: list[tuple[str, str, str]]) -> None:
        """Replace every switch with the store's ``(scope, kind, name)`` rows."""
        tools: dict[str, set[str]] = {}
        for scope, kind, name in rows:
            if kind == "tool":
                tools.setdefault(scope, set()).add(name)
        self._tools = tools
        self._frozen = {scope for scope, kind, _ in rows if kind == "freeze"}
        self._touch()

    # -- read on every step and call: a set lookup or two ---------------------------------

    def frozen_for(self, tenant: str) -> bool:
        """Whether ``tenant``'s tasks may start no new step (its freeze, or the cluster's)."""
        return bool(self._frozen) and (SYSTEM_TENANT in self._frozen or tenant in self._frozen)

    async def wait_thawed(self, tenant: str) -> None:
        """Return once ``tenant``'s tasks may start steps again (at once if they may): a
        fan-out branch held at its safe point (actors/task/branch_pool.py). Woken by the
        admin service's ``thaw`` on this node, and by the lease tick's reload of the
        switches on the others."""
        while self.frozen_for(tenant):
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()

    def tool_disabled(self, tenant: str, tool: str) -> bool:
        """Whether ``tenant``'s tasks may not call ``tool`` (its switch, or the cluster's)."""
        if not self._tools:
            return False
        return tool in self._tools.get(tenant, ()) or tool in self._tools.get(SYSTEM_TENANT, ())

    def refuse_if_disabled(self, tenant: str, tool: str) -> None:
        """Raise the failure of a call to a disabled tool: UNAVAILABLE, retryable."""
        if self.tool_disabled(tenant, tool):
            failure = ActionFailed(f"tool {tool} is disabled (kill switch)", tool=tool,
                                   retryable=True)
            failure.code = ErrorCode.UNAVAILABLE
            raise failure

    # -- changed by the admin service (after the store) ------------------------------------

    @property
    def frozen_scopes(self) -> frozenset[str]:
        return frozenset(self._frozen)

    def set_frozen(self, scope: str, on: bool) -> None:
        if on:
            self._frozen.add(scope)
        else:
            self._frozen.discard(scope)
        self._touch()

    def set_tool(self, scope: str, tool: str, disabled: bool) -> None:
        if disabled:
            self._tools.setdefault(scope, set()).add(tool)
        elif scope in self._tools:
            self._tools[scope].discard(tool)
            if not self._tools[scope]:
                del self._tools[scope]

    def disabled(self, scope: str) -> list[str]:
        """The tools disabled for ``scope``'s tasks: its own and, for a tenant, the
        cluster's."""
        own = self._tools.get(scope, set())
        return sorted(own | (self._tools.get(SYSTEM_TENANT, set())
                             if scope != SYSTEM_TENANT else set()))
