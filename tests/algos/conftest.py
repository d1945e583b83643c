"""Tests of algos (fixtures shared with other folders come from tests/support)."""
