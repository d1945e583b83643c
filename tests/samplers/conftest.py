"""Tests of samplers (fixtures shared with other folders come from tests/support)."""
