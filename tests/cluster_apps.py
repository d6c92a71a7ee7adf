"""The workflows the clustered-NATS tests serve (``ratchet serve --app
tests.cluster_apps:app``): step chains (tests/apps.py), an approval that parks its task, a
fan-out whose join waits for ``branch.done`` mail (tests/graph_apps.py), and a durable
sleep (tests/sleep_apps.py)."""

from __future__ import annotations

import ratchet
from ratchet import JoinPolicy
from tests.apps import ten, three
from tests.graph_apps import ABC, approve, fanout_workflow
from tests.sleep_apps import nap

app = ratchet.Registry([three, ten, approve, nap,
                        fanout_workflow("fan.all", ABC, JoinPolicy("all"))])
