"""Side effects, exactly once or UNKNOWN: the action runner (ledger, retries, budgets,
deadlines), tool sessions, the saga (compensation), and the kill switches.
"""
