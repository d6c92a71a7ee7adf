"""Example workflows for the README (not installed; serve them from the repository root)."""
