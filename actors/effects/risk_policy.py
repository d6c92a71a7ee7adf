"""Which tool calls need a human's approval before they are made: the risk tiers as data
and one pure function over them (the gateway that parks a call is actors/effects/risk.py).

A write needs approval when its tool is ``irreversible``, declares ``requires_approval``,
or its amount is above ``max_amount``. A tenant's policy (``NodeConfig.risk_policy``,
``ratchet serve --risk-policy FILE``) can only tighten that, never loosen it:

    {"acme": {"pay": {"requires_approval": true}, "*": {"max_amount": 500}}}

per tenant (``"*"``: every tenant), per tool (``"*"``: every write of the tenant). Several
rules that apply combine to the tightest: approval if any requires it, the lowest
``max_amount``. A ``max_amount`` on a tool whose amount cannot be read (it declares no
``amount``, or it is not a number) asks approval for every call: a limit that cannot be
checked is not taken as met. Reads are never gated (they have no idempotency key to be
approved once).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.errors import ToolDefinitionError

__all__ = ["ANY", "RiskPolicy", "ToolRisk", "amount_of", "parse_policy", "tightening",
           "why_gated"]

#: A policy key meaning every tenant, or every tool of a tenant.
ANY = "*"


@dataclass(frozen=True, slots=True)
class ToolRisk:
    """A tenant's tightening of one tool's tier (or, under ``"*"``, of every write)."""

    requires_approval: bool = False
    max_amount: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.requires_approval, bool):
            raise ToolDefinitionError(f"requires_approval must be true or false: {self}")
        if self.max_amount is not None and (
                isinstance(self.max_amount, bool) or not isinstance(self.max_amount, int | float)
                or not math.isfinite(self.max_amount) or self.max_amount < 0):
            raise ToolDefinitionError(f"max_amount must be a number >= 0: {self}")


#: tenant (or ``"*"``) → tool name (or ``"*"``) → its tightening.
RiskPolicy = Mapping[str, Mapping[str, ToolRisk]]


def parse_policy(raw: Any) -> dict[str, dict[str, ToolRisk]]:
    """A policy from its JSON form; ``ToolDefinitionError`` naming the bad part."""
    if not isinstance(raw, Mapping):
        raise ToolDefinitionError("a risk policy is a map of tenants")
    policy: dict[str, dict[str, ToolRisk]] = {}
    for tenant, tools in raw.items():
        if not isinstance(tools, Mapping):
            raise ToolDefinitionError(f"risk policy of {tenant!r}: a map of tools")
        policy[str(tenant)] = {}
        for name, rule in tools.items():
            unknown = set(rule) - {"requires_approval", "max_amount"} \
                if isinstance(rule, Mapping) else {"(not a map)"}
            if unknown:
                raise ToolDefinitionError(f"risk policy of {tenant!r}, tool {name!r}: "
                                          f"unknown {sorted(unknown)}")
            policy[str(tenant)][str(name)] = ToolRisk(**rule)
    return policy


def tightening(policy: RiskPolicy, tenant: str, tool: str) -> ToolRisk | None:
    """The tenant's rules for ``tool``, combined to the tightest (None: no rule)."""
    if not policy:
        return None  # the usual case, on every write: no lookups
    rules = [r for scope in (tenant, ANY) for name in (tool, ANY)
             if (r := policy.get(scope, {}).get(name)) is not None]
    if not rules:
        return None
    limits = [r.max_amount for r in rules if r.max_amount is not None]
    return ToolRisk(any(r.requires_approval for r in rules), min(limits) if limits else None)


def amount_of(tool: Tool[Any, Any], args: Any) -> float | None:
    """The call's amount, as the tool declares it; None when it cannot be read."""
    if tool.amount is None:
        return None
    try:
        value = getattr(args, tool.amount) if isinstance(tool.amount, str) else tool.amount(args)
        amount = float(value)
    except Exception:  # unreadable: the caller asks approval rather than guess
        return None
    return amount if math.isfinite(amount) else None


def why_gated(tool: Tool[Any, Any], args: Any, tenant_rule: ToolRisk | None
              ) -> dict[str, Any] | None:
    """Why this call needs approval (for the human's package), or None when it does not."""
    if tool.kind != "write":
        return None
    if tool.tier == "irreversible":
        return {"why": "irreversible tool", "tier": tool.tier}
    if tool.requires_approval or (tenant_rule is not None and tenant_rule.requires_approval):
        return {"why": "approval required", "tier": tool.tier,
                "by": "tool" if tool.requires_approval else "tenant policy"}
    limits = [m for m in (tool.max_amount, tenant_rule.max_amount if tenant_rule else None)
              if m is not None]
    if not limits:
        return None
    amount, limit = amount_of(tool, args), min(limits)
    if amount is None:
        return {"why": "amount unreadable", "tier": tool.tier, "max_amount": limit}
    if amount > limit:
        return {"why": "amount above threshold", "tier": tool.tier, "amount": amount,
                "max_amount": limit}
    return None
