"""The ``ratchet`` argument parser."""

from __future__ import annotations

import argparse
import importlib.metadata
import os

from ratchet.protocol.admin_verbs import VERB_ROLES
from ratchet.protocol.auth import ROLES
from ratchet.supervisors.cli.common import DEFAULT_STATE_DIR
from ratchet.supervisors.cli.serve import serve_flags
from ratchet.supervisors.cli.tasks import submit_flags, watch_flags


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ratchet", description="Ratchet durable task runtime")
    p.add_argument(
        "--version",
        action="version",
        version=f"ratchet {importlib.metadata.version('ratchet-runtime')}",
    )
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="default: .ratchet")
    p.add_argument("--log-level", default=os.environ.get("RATCHET_LOG_LEVEL", "info"))
    sub = p.add_subparsers(dest="command", required=True)

    def with_nats(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--nats-url", default=None)
        sp.add_argument("--tenant", default="default")
        sp.add_argument(
            "--creds",
            default=None,
            help="key file to sign with (default: $RATCHET_CREDS, else the"
            " state dir's keys/local-admin.nk)",
        )
        return sp

    serve_flags(sub.add_parser("serve", help="run a node in the foreground"))

    submit_flags(with_nats(sub.add_parser("submit", help="submit a task (validated by the node)")))
    watch_flags(with_nats(sub.add_parser("watch", help="print a task's events live")))

    s = with_nats(sub.add_parser("status", help="print a task's snapshot"))
    s.add_argument("task_id")

    s = with_nats(sub.add_parser("admin", help="an admin command (docs/admin.md)"))
    s.add_argument("verb", choices=list(VERB_ROLES))
    s.add_argument(
        "task_id",
        nargs="?",
        default=None,
        help="the task (for drain, undrain and clock-ack: the node id; for"
        " grant and revoke: the principal's name)",
    )
    s.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="verb arguments, e.g. --arg after=5 --arg status=RUNNING",
    )
    s.add_argument("--command-id", default=None, help="repeat one to get its first answer")
    s.add_argument(
        "--expected-version",
        type=int,
        default=None,
        help="act only if the task is still at this version",
    )
    s.add_argument(
        "--args",
        dest="args_json",
        default=None,
        help='verb arguments as a JSON object, e.g. \'{"input": {"x": 1}}\'',
    )

    s = with_nats(
        sub.add_parser("creds", help="issue a key: a seed file for one principal (docs/security.md)")
    )
    s.add_argument("--name", required=True, help="the principal's name (a token)")
    s.add_argument(
        "--role",
        action="append",
        required=True,
        choices=sorted(ROLES),
        help="a role of the key (repeat for several)",
    )
    s.add_argument("--out", default=None, help="where to write the seed (default: NAME.nk)")
    s.add_argument(
        "--expires-in",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the key is refused this long after it is granted",
    )
    sub.add_parser(
        "nats-config",
        help="print the keyring's nats-server authorization block (for an external NATS)",
    )

    s = sub.add_parser("graph", help="print a workflow's transition table and Mermaid diagram")
    s.add_argument("workflow")
    s.add_argument("--app", required=True, help="module:object registering workflows")
    s.add_argument("--version", type=int, default=None)
    s.add_argument("--format", choices=["both", "table", "mermaid"], default="both")

    s = sub.add_parser("demo", help="run the demo on the embedded default")
    s.add_argument("--nats-url", default=None)
    return p
