"""Test components: a clock tests move by hand, and simulators of the outside world
(providers), with fault injection. Not part of the runtime; no layer imports them (the
command line's ``ratchet demo`` excepted).

The finance provider itself lives in :mod:`ratchet.testing.finance` (run it with
``python -m ratchet.testing.finance``, or from code with :class:`FinanceSimulatorProcess`); it is
not re-exported here so that running it with ``-m`` does not import it twice.
"""

from ratchet.protocol.clock import FakeClock
from ratchet.testing.finance_client import FinanceClient
from ratchet.testing.process import FinanceSimulatorProcess, SimulatorStartError
from ratchet.testing.replay import replay, replay_corpus

__all__ = ["FakeClock", "FinanceClient", "FinanceSimulatorProcess", "SimulatorStartError",
           "replay", "replay_corpus"]
