"""Tests of experiments (fixtures shared with other folders come from tests/support)."""
