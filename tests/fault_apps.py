"""The workflows the fault tests serve (`ratchet serve --app tests.fault_apps:app`): plain
step chains (tests/apps.py) and an approval that parks its task (tests/graph_apps.py)."""

from __future__ import annotations

import ratchet
from tests.apps import ten, three
from tests.graph_apps import approve

app = ratchet.Registry([three, ten, approve])
