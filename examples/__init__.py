"""Example workflows (the demo app)."""
