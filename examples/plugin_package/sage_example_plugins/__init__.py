"""Example plug-ins for sage-grpo, one of each kind (declared as entry points in this package's pyproject)."""
