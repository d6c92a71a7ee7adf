"""Simulators of the outside world (providers), with fault injection.

The finance provider itself lives in :mod:`simulators.finance` (run it with
``python -m simulators.finance``, or from code with :class:`FinanceSimulatorProcess`); it is
not re-exported here so that running it with ``-m`` does not import it twice.
"""

from simulators.finance_client import FinanceClient
from simulators.process import FinanceSimulatorProcess, SimulatorStartError

__all__ = ["FinanceClient", "FinanceSimulatorProcess", "SimulatorStartError"]
