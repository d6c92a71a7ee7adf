"""The ``ratchet`` command holds the cyclic collector off while a node starts
(supervisors/cli/startup_gc.py); importing the CLI does not."""

from __future__ import annotations

import gc
import subprocess
import sys

from ratchet.supervisors.cli import startup_gc
from tests.conftest import ROOT


def test_release_starts_the_collector_the_entry_point_stopped_and_freezes_the_start() -> None:
    gc.disable()
    try:
        startup_gc.adopt()
        startup_gc.release()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
        gc.disable()
        startup_gc.release()  # released once: a second release leaves it alone
        assert not gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_release_leaves_a_collector_it_did_not_stop_alone() -> None:
    gc.disable()
    try:
        startup_gc.release()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_importing_the_cli_leaves_the_collector_running_and_a_command_releases_it() -> None:
    code = ("import gc, sys\n"
            "import ratchet.supervisors.cli\n"
            "assert gc.isenabled()\n"
            "from ratchet.__main__ import main\n"
            "sys.argv = ['ratchet', 'graph', '--app', 'bench.app:app', '--format', 'table',"
            " 'sleepy']\n"
            "assert main() == 0\n"
            "print(gc.isenabled())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True"
