"""The node's services, each a supervised actor: intake (submissions), the outbox relay
(events out), the API and admin request services, the mail router per partition and the
routers for decisions and external messages, timers, the recovery sweeper, retention.
"""
