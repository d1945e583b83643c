"""Tests of data (fixtures shared with other folders come from tests/support)."""
