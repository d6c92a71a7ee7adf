"""The workflow authoring API: the graph and its node kinds, the registry of workflows,
tools (their contracts and retry classification), and the join policy. What an
application imports to define its work; it runs nothing.
"""
