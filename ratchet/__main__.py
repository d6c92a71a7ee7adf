"""The ``ratchet`` command (``[project.scripts]``) and ``python -m ratchet``.

Before anything else is imported: the cyclic garbage collector is held off until the node
serves, or at once for a command other than ``serve`` (supervisors/cli/startup_gc.py);
the code the standard library compiles from text as classes are defined (dataclass
methods, forward references, named tuples) is the code compiled at an earlier start
(ratchet/code_cache.py), until the same moment; and when the log lines are JSON
(stderr is not a terminal), structlog is imported without rich (below). Only this entry
does that: importing ``ratchet.supervisors.cli`` (its ``main`` included) leaves all three
alone (docs/operations.md, "Restart (W4)").
"""

import gc
import sys


def _structlog_without_rich() -> None:
    """Import structlog as if rich were not installed, when this process's log lines are
    JSON (supervisors/node/log_output.py: stderr is not a terminal).

    structlog imports rich (and through it attrs and pygments) whenever rich is installed,
    for its coloured console tracebacks and reprs, JSON lines or not: ~50 ms of a start.
    JSON lines never use them (their traceback is the standard library's), so rich is
    hidden while structlog is imported (``None`` in ``sys.modules``: ``import rich``
    raises ImportError, which structlog expects) and shown again at once, for the
    commands that print tables for people (supervisors/cli/human.py).
    """
    try:
        console = sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):  # no stderr, or a closed one
        console = False
    if console or "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


def main() -> int:
    held = gc.isenabled()
    gc.disable()
    from ratchet import code_cache

    code_cache.install()
    _structlog_without_rich()
    from ratchet.supervisors.cli import main as command
    from ratchet.supervisors.cli.startup_gc import adopt, at_release

    if held:
        adopt()
    at_release(code_cache.release)
    return command()


if __name__ == "__main__":
    raise SystemExit(main())
