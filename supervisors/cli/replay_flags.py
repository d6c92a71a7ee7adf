"""The flags of ``ratchet replay`` and ``ratchet export`` (the commands: cli/replay.py),
apart from the commands so that building the parser does not import the replay engine
(docs/operations.md, "Restart (W4)")."""

from __future__ import annotations

import argparse
import os
import re
import time

__all__ = ["export_flags", "parse_since", "replay_flags", "store_flag"]

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def replay_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("task_id", nargs="?", default=None, help="the recorded task to replay")
    sp.add_argument("--app", default=os.environ.get("RATCHET_APP"),
                    help="module:object with the candidate workflows (default: $RATCHET_APP)")
    sp.add_argument("--version", type=int, default=None,
                    help="replay against this version of the workflow (default: the task's)")
    sp.add_argument("--until", type=int, default=None, metavar="SEQ",
                    help="stop after checkpoint SEQ")
    sp.add_argument("--live-reads", action="store_true",
                    help="a read with no recorded answer calls its tool (writes never do)")
    sp.add_argument("--corpus", default=None, metavar="FILE|DIR|QUERY",
                    help="replay many tasks: an export file, a directory of them, or a query"
                    " of the store, e.g. workflow=expense,status=SUCCEEDED,since=1d")
    store_flag(sp)


def export_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    sp.add_argument("--task", action="append", default=[], metavar="ID",
                    help="a task to export (repeat); else those the filters select")
    sp.add_argument("--workflow", default=None)
    sp.add_argument("--status", default=None, help="e.g. SUCCEEDED")
    sp.add_argument("--since", default=None, type=parse_since, metavar="AGE",
                    help="created within AGE: seconds, or 30m, 12h, 1d")
    sp.add_argument("--tenant", default=None)
    sp.add_argument("--limit", type=int, default=10_000)
    store_flag(sp)


def store_flag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--store", default=None, metavar="FILE|URL",
                    help="the store, read-only: a SQLite file or a postgresql:// URL (default:"
                    " $RATCHET_STORE, else <state-dir>/ratchet.db)")


def parse_since(text: str) -> float:
    """An age (``90``, ``30m``, ``12h``, ``1d``) as the epoch time that long ago."""
    m = _SINCE.match(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age: seconds, or 30m, 12h, 1d")
    return time.time() - float(m.group(1)) * _UNITS[m.group(2)]
