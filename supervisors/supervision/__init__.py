"""Supervision: supervisors and their restart policy, and task supervision (one supervisor
per task, activated on demand, with the node's fair admission scheduler).
"""
