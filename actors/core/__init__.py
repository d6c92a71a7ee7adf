"""The actor core: actors, their refs (mail, ask, stop, out-of-band interrupt) and the
actor system; ``ServiceActor`` for long-running services; backoff delays. Imports nothing
else of the package but ``protocol``.
"""
