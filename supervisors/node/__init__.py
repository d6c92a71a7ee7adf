"""The node: its configuration, start-up wiring and stop; partition leases (held leases, the
lease manager, partition work on acquire/lose/hand-over); the embedded nats-server.
"""
