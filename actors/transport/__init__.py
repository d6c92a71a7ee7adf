"""NATS JetStream transport: the bus (streams, their limits, pull loops, redelivery) and the
client producers, subscribers and operators use (submit, await, watch, admin).
"""
