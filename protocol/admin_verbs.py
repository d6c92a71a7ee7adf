"""The admin verbs and the role each needs: shared by the admin service and the CLI."""

from __future__ import annotations

__all__ = ["ANY_SCOPE", "CLUSTER_VERBS", "DLQ_VERBS", "KEY_VERBS", "SWITCH_VERBS", "SYSTEM_TENANT", "VERB_ROLES"]

#: The role each verb needs.
VERB_ROLES: dict[str, str] = {
    "get": "viewer", "history": "viewer", "list": "viewer", "tree": "viewer",
    "handoff": "viewer", "cancel": "operator", "pause": "operator", "resume": "operator",
    "approve": "approver", "reject": "approver", "restart": "operator", "fork": "operator",
    "disable-tool": "operator", "enable-tool": "operator", "freeze": "operator",
    "thaw": "operator", "purge": "operator", "breakers": "viewer",
    "model-stats": "viewer", "diagnose": "viewer",
    # Time travel: a task's past states (supervisors/services/admin_history.py).
    "state": "viewer", "diff": "viewer", "bisect": "viewer",
    # Settling what a machine could not (supervisors/services/admin_settle.py).
    "resolve": "approver", "retry-action": "approver", "skip-step": "approver",
    "approvals": "viewer", "retry-branch": "operator",
    # Workflow versions (supervisors/services/admin_versions.py).
    "migrate": "operator", "versions": "viewer",
    # The dead-letter queue (docs/admin.md, "Dead letters"): on a tenant's subject its own
    # letters, on the SYSTEM_TENANT's every letter.
    "dlq-list": "viewer", "dlq-show": "viewer", "dlq-replay": "operator",
    "dlq-purge": "operator",
    # Schedules of the tenant's workflows (protocol/schedules.py).
    "schedule-create": "operator", "schedule-list": "viewer", "schedule-delete": "operator",
    "schedule-pause": "operator", "schedule-resume": "operator",
    # The cluster: on the SYSTEM_TENANT's subject only (ratchet.admin._system.<verb>).
    "nodes": "viewer", "drain": "operator", "undrain": "operator", "clock-ack": "operator",
    "verify-audit": "operator",
    # The keyring (docs/security.md): who acts as whom, in which tenant, with which roles.
    "grant": "operator", "revoke": "operator", "keys": "operator",
}
#: The keyring's verbs: cluster verbs too (only a _system operator changes the keyring).
KEY_VERBS = frozenset({"grant", "revoke", "keys"})
#: Verbs about the cluster, not about one tenant's tasks (the audit chain is one per
#: store, across tenants).
CLUSTER_VERBS = frozenset({"nodes", "drain", "undrain", "clock-ack", "verify-audit"}) | KEY_VERBS
#: The kill switches: on a tenant's subject they act on its tasks, on the SYSTEM_TENANT's
#: on every tenant's (docs/admin.md).
SWITCH_VERBS = frozenset({"freeze", "thaw", "disable-tool", "enable-tool"})
#: The dead-letter verbs: on a tenant's subject they act on its letters, on the
#: SYSTEM_TENANT's on every letter.
DLQ_VERBS = frozenset({"dlq-list", "dlq-show", "dlq-replay", "dlq-purge"})
#: Verbs that act on the subject's tenant, or on every tenant on the SYSTEM_TENANT's.
ANY_SCOPE = SWITCH_VERBS | DLQ_VERBS
#: The tenant token of cluster commands; give it only to the platform's operators.
SYSTEM_TENANT = "_system"
