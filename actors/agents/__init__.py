"""Models for agent nodes: the model interface, the OpenAI-compatible adapter, the scripted
model, and loop detection.
"""
