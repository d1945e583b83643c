"""Tests of train (fixtures shared with other folders come from tests/support)."""
