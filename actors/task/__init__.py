"""The task actor and its behaviours. ``actor.py`` runs one task and implements the
``TaskKernel`` (``kernel.py``) the behaviours are written against: graph nodes
(``graph_runtime``, ``graph_waits``), fan-out branches and joins (``fanout``), agent nodes
(``agent_node``), suspension and the saga's end (``suspension``), waits (``waits``),
operator control (``control``), the crash-loop guard (``crash_loop``), progress
heartbeats (``progress``); ``mail.py`` routes mail to them; ``deps.py`` is what every task
actor of a node is given.
"""
