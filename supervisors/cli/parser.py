"""The ``ratchet`` argument parser.

The options every command shares (``--state-dir``, ``--log-level``, ``--output``) are
accepted before the subcommand, as always, and after it (``ratchet serve --state-dir X``),
where they are listed in the subcommand's ``--help``: each subparser has them through a
parent parser whose defaults are ``SUPPRESS``, so a value given after the subcommand
overrides one given before, and an absent one leaves it alone.

A usage error is one line on stderr that says what is wrong and where help is, exit 2
(:class:`RatchetArgumentParser`); option values that must be JSON are checked here, so a
typo never reaches a node nor prints a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ratchet.protocol.admin_verbs import VERB_ROLES
from ratchet.protocol.auth import ROLES
from ratchet.supervisors.cli.common import DEFAULT_STATE_DIR, ExitCode
from ratchet.supervisors.cli.output import OutputMode
from ratchet.supervisors.cli.replay_flags import export_flags, replay_flags
from ratchet.supervisors.cli.schedule import schedule_flags
from ratchet.supervisors.cli.serve_flags import serve_flags
from ratchet.supervisors.cli.tasks import submit_flags, watch_flags
from ratchet.supervisors.node.log_output import LOG_LEVELS

__all__ = ["RatchetArgumentParser", "json_object", "json_object_text", "parser"]


class RatchetArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def log_level(text: str) -> str:
    """``--log-level``: one of LOG_LEVELS, any case."""
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown level {text!r}: use one of {', '.join(LOG_LEVELS)}")
    return text.lower()


def json_object(text: str) -> dict[str, Any]:
    """An option whose value is a JSON object, decoded."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"not valid JSON ({exc.msg} at character {exc.pos}): {text!r}; quote it"
            """ whole, e.g. '{"items": [1, 2]}'""") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object ({{...}}), not {type(value).__name__}: {text!r}")
    return value


def json_object_text(text: str) -> str:
    """An option whose value is a JSON object, checked here and kept as text (the command
    decodes it where it uses it)."""
    json_object(text)
    return text


def key_value(text: str) -> str:
    """``--arg KEY=VALUE``: checked to have a key and an ``=``."""
    key, equals, _ = text.partition("=")
    if not key or not equals:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE, e.g. reason=typo")
    return text


def shared_options(*, after_command: bool) -> RatchetArgumentParser:
    """The options of every command; ``after_command``: the copy each subparser gets,
    whose defaults are SUPPRESS (an option not given there keeps the value from before)."""
    p = RatchetArgumentParser(add_help=False)

    def default(value: str) -> str:
        return argparse.SUPPRESS if after_command else value

    group = p.add_argument_group("options of every command")
    group.add_argument("--state-dir", metavar="DIR", default=default(DEFAULT_STATE_DIR),
                       help=f"the node's state directory (default: {DEFAULT_STATE_DIR};"
                       " $RATCHET_STATE_DIR)")
    group.add_argument("--log-level", type=log_level, metavar="LEVEL",
                       default=default(os.environ.get("RATCHET_LOG_LEVEL", "info")),
                       help=f"{', '.join(LOG_LEVELS)} (default: info; $RATCHET_LOG_LEVEL)")
    group.add_argument("--output", choices=[m.value for m in OutputMode],
                       default=default(OutputMode.AUTO.value),
                       help="json: one JSON object per line; human: tables and colours;"
                       " auto (default): human on a terminal, json into a pipe or file")
    return p


#: Adds a subcommand (with the shared options) to the ``ratchet`` parser.
AddCommand = Callable[..., argparse.ArgumentParser]


def with_nats(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a command that talks to a node over NATS."""
    sp.add_argument("--nats-url", action="append", default=None, metavar="URL[,URL...]",
                    help="NATS (a cluster: its servers comma-separated or the flag repeated);"
                    " default: $RATCHET_NATS_URL, else the state dir's embedded server")
    sp.add_argument("--tenant", default="default")
    sp.add_argument(
        "--creds",
        default=None,
        help="key file to sign with (default: $RATCHET_CREDS, else the"
        " state dir's keys/local-admin.nk)",
    )
    return sp


def task_commands(command: AddCommand) -> None:
    """``submit``, ``watch``, ``status``."""
    submit_flags(with_nats(command("submit", help="submit a task (validated by the node)")))
    watch_flags(with_nats(command("watch", help="print a task's events live")))

    s = with_nats(command("status", help="print a task's snapshot"))
    s.add_argument("task_id")

    s = with_nats(command("diagnose", help="why a task is where it is (admin diagnose)"))
    s.add_argument("task_id")


def admin_command(command: AddCommand) -> None:
    s = with_nats(command("admin", help="an admin command (docs/admin.md)"))
    s.add_argument("verb", choices=[*VERB_ROLES, "dlq"],
                   help="a verb; dlq list|show|replay|purge [ID ...] (docs/admin.md)")
    s.add_argument(
        "task_id",
        nargs="?",
        default=None,
        help="the task (for drain, undrain and clock-ack: the node id; for"
        " grant and revoke: the principal's name; for dlq: list, show, replay or purge)",
    )
    s.add_argument("ids", nargs="*", type=int, default=[], metavar="ID",
                   help="for dlq show, replay and purge: dead letter ids")
    s.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE", type=key_value,
                   help="verb arguments, e.g. --arg after=5 --arg status=RUNNING")
    s.add_argument("--command-id", default=None, help="repeat one to get its first answer")
    s.add_argument("--expected-version", type=int, default=None,
                   help="act only if the task is still at this version")
    s.add_argument("--to-version", type=int, default=None, metavar="N",
                   help="migrate: the workflow version to move the task to")
    s.add_argument("--args", dest="args_json", default=None, type=json_object,
                   help='verb arguments as a JSON object, e.g. \'{"input": {"x": 1}}\'')
    settle = s.add_argument_group("resolve, retry-action, skip-step (docs/admin.md)")
    settle.add_argument("--action", default=None, metavar="KEY",
                        help="the action's idempotency key")
    settle.add_argument("--outcome", default=None, choices=["succeeded", "failed",
                                                            "compensated"])
    settle.add_argument("--evidence", default=None, help="what the human found, and where")
    settle.add_argument("--request-hash", default=None, metavar="HASH",
                        help="the action's request hash, as the handoff package showed it")
    settle.add_argument("--result", default=None, type=json_object,
                        help="the provider's result, for --outcome succeeded (a JSON object)")
    settle.add_argument("--provider-id", default=None, help="the provider's id of the action")
    settle.add_argument("--reason", default=None, help="why (skip-step, cancel, ...)")
    fork = s.add_argument_group("fork (docs/admin.md)")
    fork.add_argument("--sandbox", action="store_true", default=None,
                      help="a sandbox fork: no write reaches a provider, its events go to"
                      " ratchet.sandbox.events.>")
    fork.add_argument("--reuse-model", action="store_true", default=None,
                      help="with --sandbox: agents' model calls answered from the original's"
                      " recorded turns where the request is the same")


def key_commands(command: AddCommand) -> None:
    """``creds``, ``nats-config`` and ``console-login``."""
    s = with_nats(
        command("creds", help="issue a key: a seed file for one principal (docs/security.md)")
    )
    s.add_argument("--name", required=True, help="the principal's name (a token)")
    s.add_argument("--role", action="append", required=True, choices=sorted(ROLES),
                   help="a role of the key (repeat for several)")
    s.add_argument("--out", default=None, help="where to write the seed (default: NAME.nk)")
    s.add_argument("--expires-in", type=float, default=None, metavar="SECONDS",
                   help="the key is refused this long after it is granted")
    command("nats-config",
            help="print the keyring's nats-server authorization block (for an external NATS)")
    s = command("console-login", help="sign a web console's login challenge: prints the"
                " code to paste (docs/security.md)")
    s.add_argument("challenge", help="the challenge the console's login page shows")
    s.add_argument("--node", required=True, help="the node id the login page names")
    s.add_argument("--creds", default=None, help="key file to sign with (default:"
                   " $RATCHET_CREDS, else the state dir's keys/local-admin.nk)")


def tool_worker_flags(sp: argparse.ArgumentParser) -> None:
    """``ratchet tool-worker`` (supervisors/cli/tool_worker.py)."""
    sp.add_argument("--app", required=True, help="module:object, a tool or a list of tools")
    sp.add_argument("--nats-url", action="append", default=None, metavar="URL[,URL...]",
                    help="NATS; default: $RATCHET_NATS_URL, else the state dir's server")
    sp.add_argument("--tenant", action="append", default=None,
                    help="a tenant whose requests to serve (repeat; default: default)")
    sp.add_argument("--nats-creds", type=Path, default=None,
                    help="an nkey seed or .creds file to connect with")
    sp.add_argument("--max-in-flight", type=int, default=16,
                    help="requests of one tool in progress at once (default 16)")
    sp.add_argument("--ack-wait", type=float, default=30.0,
                    help="seconds before an unacked request is redelivered (default 30)")
    sp.add_argument("--max-deliver", type=int, default=5,
                    help="the delivery of a request dead-lettered instead of run (default 5)")
    sp.add_argument("--worker-id", default=None,
                    help="[A-Za-z0-9_]{1,32}: keep it across restarts to take back this"
                         " worker's pinned sessions' calls (default: a fresh one)")


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked (the
    lookup reads every installed distribution's metadata: ~6 ms of each start otherwise)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"ratchet {importlib.metadata.version('ratchet-runtime')}")  # as argparse's
        parser.exit()


def parser() -> argparse.ArgumentParser:
    p = RatchetArgumentParser(prog="ratchet", description="Ratchet durable task runtime",
                              parents=[shared_options(after_command=False)],
                              epilog="exit codes: docs/cli.md")
    p.add_argument("--version", action=_Version, help="show program's version number and exit")
    shared = shared_options(after_command=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[shared], **kwargs)

    serve_flags(command("serve", help="run a node in the foreground"))
    task_commands(command)
    admin_command(command)
    key_commands(command)
    schedule_flags(command("schedule", help="durable schedules of a workflow"), with_nats)

    s = with_nats(command("versions", help="workflow versions and the tasks on each"))
    s.add_argument("workflow", nargs="?", default=None, help="only this workflow")

    s = command("graph", help="print a workflow's transition table and Mermaid diagram")
    s.add_argument("workflow")
    s.add_argument("--app", required=True, help="module:object registering workflows")
    s.add_argument("--version", type=int, default=None)
    s.add_argument("--format", choices=["both", "table", "mermaid"], default="both")

    replay_flags(command("replay", help="re-run a recorded task's code against its history"
                         " (no store write, no publish, no provider call)"))
    export_flags(command("export", help="write recorded tasks to a file for replay --corpus"))

    tool_worker_flags(command("tool-worker", help="serve tools to nodes from this process"
                              " (docs/protocol.md)"))

    s = command("demo", help="run the demo on the embedded default")
    s.add_argument("--nats-url", default=None)
    return p
