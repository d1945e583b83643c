"""Tests of reporting (fixtures shared with other folders come from tests/support)."""
