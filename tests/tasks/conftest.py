"""Tests of tasks (fixtures shared with other folders come from tests/support)."""
