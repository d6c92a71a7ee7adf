"""The ``ratchet`` command (``[project.scripts]``) and ``python -m ratchet``.

The cyclic garbage collector is held off before anything is imported, until the node
serves, or at once for a command other than ``serve`` (supervisors/cli/startup_gc.py).
Only this entry does that: importing ``ratchet.supervisors.cli`` (its ``main`` included)
leaves the collector alone.
"""

import gc


def main() -> int:
    held = gc.isenabled()
    gc.disable()
    from ratchet.supervisors.cli import main as command
    from ratchet.supervisors.cli.startup_gc import adopt

    if held:
        adopt()
    return command()


if __name__ == "__main__":
    raise SystemExit(main())
