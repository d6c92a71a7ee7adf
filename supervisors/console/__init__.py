"""The web console (docs/operations.md, "The web console"; docs/security.md, "The web
console"): tasks, their graphs, checkpoints, ledger and pending decisions, the nodes; the
decisions go through the admin service as the logged-in principal."""

from ratchet.supervisors.console.app import Console
from ratchet.supervisors.console.auth import login_code

__all__ = ["Console", "login_code"]
