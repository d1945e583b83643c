"""Helpers shared by the test folders (importable as ``support.*``; tests/ is on the path)."""
