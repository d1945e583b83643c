"""Tests of rewards (fixtures shared with other folders come from tests/support)."""
